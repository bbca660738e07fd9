"""bench/smoke.py (``make bench``), the CI guard over the benches: every bench that no other test
here runs at its smoke size runs once and must exit 0 with one JSON object; the driver reports a
crash, a timeout or stray output as a failure and never judges a figure."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Each of these has a test of its own that runs its smoke size (tests/bench/test_*.py).
COVERED_ELSEWHERE = ("ga_wrapper", "infinity_batch", "accelerate", "data_convert", "master_scale", "ps_wal", "tls")


def smoke_module():
    spec = importlib.util.spec_from_file_location("bench_smoke", BENCH / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("body, error", [
    ("raise SystemExit(3)", "exit 3"),
    ("print('done')", "stdout is not one JSON object"),
    ("print('[1, 2]')", "stdout is a JSON list, not an object"),
])
def test_a_crash_or_stray_output_is_a_failure(tmp_path, body, error):
    script = tmp_path / "fake_bench.py"
    script.write_text(body + "\n")
    result = smoke_module().run_one("fake", [str(script)], timeout=60)
    assert result["ok"] is False and result["error"].startswith(error)


def test_a_bench_that_runs_is_ok_whatever_its_figures_and_its_ratios_are_reported(tmp_path):
    script = tmp_path / "fake_bench.py"
    script.write_text("import json\nprint(json.dumps({'bench': 'fake', 'ratio': 0.1, 'met': False, 'steps': 9, "
                      "'dense': {'vs_raw': 0.5, 'mb': 4}, 'runs': [1, 2]}))\n")
    result = smoke_module().run_one("fake", [str(script)], timeout=60)
    assert result["ok"] is True
    assert result["ratios"] == {"ratio": 0.1, "met": False, "dense.vs_raw": 0.5}


def test_every_bench_not_run_by_its_own_test_runs_at_its_smoke_size():
    skip = [name for name in COVERED_ELSEWHERE if name in smoke_module().SMOKE]
    out = subprocess.run([sys.executable, str(BENCH / "smoke.py"), "--skip", *skip], capture_output=True,
                         text=True, timeout=900)
    summary = json.loads(out.stdout)
    failed = {name: r for name, r in summary["benches"].items() if not r["ok"]}
    assert out.returncode == 0 and summary["ok"] and not failed, (failed, out.stderr[-3000:])
    assert set(summary["benches"]) == set(smoke_module().SMOKE) - set(skip)
