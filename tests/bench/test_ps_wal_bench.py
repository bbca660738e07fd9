"""bench/ps_wal.py: a small run end to end prints one JSON object (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_small_run_prints_one_json_object_with_recycled_segments(tmp_path):
    # 1 MiB pushes, 45 rounds: two checkpoints (every 20), so the steady part comes after recycling starts
    out = subprocess.run([sys.executable, str(BENCH / "ps_wal.py"), "--mb", "1", "--pushes", "45",
                          "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bench"] == "ps_wal" and result["config"]["pushes"] == 45
    assert result["ratio_first"]["n"] == 41 and result["ratio_steady"]["n"] == 4
    low, high = result["ratio_steady"]["ci95"]
    assert 0 < low <= result["ratio_steady"]["median"] <= high
    assert [f for f in result["files_at_end"] if f.endswith(".ckpt")] == ["version-20.ckpt", "version-40.ckpt"]
