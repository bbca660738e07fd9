"""bench/kill_detect.py: a small run prints one JSON object with every victim's kill -> EOF time
(no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_small_run_prints_one_json_object_with_every_victim():
    out = subprocess.run([sys.executable, str(BENCH / "kill_detect.py"), "--rounds", "1", "--extra-mb", "4"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bench"] == "kill_detect"
    assert set(result["kill_to_eof_ms"]) == {"python", "torch", "torch_plus_4mb"}
    assert all(len(side["samples"]) == 1 and side["median"] > 0 for side in result["kill_to_eof_ms"].values())
    assert result["ratio_over_python"]["python"] == 1.0


def test_bad_flags_are_named():
    out = subprocess.run([sys.executable, str(BENCH / "kill_detect.py"), "--rounds", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--rounds must be >= 1" in out.stderr
