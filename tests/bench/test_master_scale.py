"""bench/master_scale.py --smoke: the real master against 50 simulated workers prints one JSON object
of the expected shape (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_smoke_size_prints_one_json_object():
    out = subprocess.run([sys.executable, str(BENCH / "master_scale.py"), "--smoke"], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["bench"] == "master_scale"
    assert result["sizes"]["workers"] == result["sizes"]["smoke"]["workers"] == 50
    assert result["sizes"]["full"]["workers"] == 1000
    for kind in ("get_task_ms", "report_task_ms", "heartbeat_ms"):
        assert result[kind]["n"] > 0 and 0 <= result[kind]["p50"] <= result[kind]["p99"], kind
        assert result["master_handler_ms"][kind.removesuffix("_ms")]["n"] > 0, kind
    formation = result["formation_s"]
    assert formation["left"] == 5 and formation["survivors"] == 45 and formation["reformed"] == 45
    assert formation["last"] >= formation["p50"] >= 0
    assert result["master_cpu"]["per_worker_per_s"] > 0 and result["master_cpu"]["seconds"] > 0
    assert result["first_round_s"] > 0 and result["rpc_per_s"] > 0
    assert set(result["met"]) == {"p99", "formation"} and set(result["targets"]) == {"p99_ms", "formation_s"}
    assert result["errors"] == {}
