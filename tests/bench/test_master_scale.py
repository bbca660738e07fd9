"""bench/master_scale.py --smoke: the real master against 50 simulated workers prints one JSON object
of the expected shape (no timing asserted), with rank 0 asking for the round (the workers today) and
with every member asking (the before side of the comparison)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("asks", ["rank0", "every"])
def test_the_smoke_size_prints_one_json_object(asks):
    out = subprocess.run([sys.executable, str(BENCH / "master_scale.py"), "--smoke", "--task-asks", asks],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["bench"] == "master_scale"
    assert result["sizes"]["workers"] == result["sizes"]["smoke"]["workers"] == 50
    assert result["sizes"]["full"]["workers"] == 1000
    # rank0: only rank 0 asks (one ask per task) and members wait for its answer; no task is reported
    # as AllReduce workers report none that succeed. every: 50 members ask and report every task.
    assert result["task_asks"] == asks and result["report_tasks"] == (asks == "every")
    kinds = ("get_task_ms", "heartbeat_ms", *(["report_task_ms"] if asks == "every" else []))
    for kind in kinds:
        assert result[kind]["n"] > 0 and 0 <= result[kind]["p50"] <= result[kind]["p99"], kind
        assert result["master_handler_ms"][kind.removesuffix("_ms")]["n"] > 0, kind
    assert (result["handoff_ms"]["n"] > 0) == (asks == "rank0")
    assert (result["report_task_ms"]["n"] > 0) == (asks == "every")
    # a task of 1 s in a 4 s window: ~2 asks per task (ahead + nothing else) by one client or by 50
    assert (result["get_task_per_s"] < 10) == (asks == "rank0"), result["get_task_per_s"]
    formation = result["formation_s"]
    assert formation["left"] == 5 and formation["survivors"] == 45 and formation["reformed"] == 45
    assert formation["last"] >= formation["p50"] >= 0
    assert result["master_cpu"]["per_worker_per_s"] > 0 and result["master_cpu"]["seconds"] > 0
    assert result["first_round_s"] > 0 and result["rpc_per_s"] > 0
    assert set(result["met"]) == {"p99", "formation"} and set(result["targets"]) == {"p99_ms", "formation_s"}
    assert result["errors"] == {}
