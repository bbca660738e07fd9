"""bench/infinity_batch.py: one small run end to end (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_small_run_prints_one_json_object():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    out = subprocess.run([sys.executable, str(BENCH / "infinity_batch.py"), "--rounds", "1", "--fit", "16",
                          "--batches", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bench"] == "infinity_batch" and set(result["sides"]) == {"plain", "accumulate", "recompute",
                                                                           "offload"}
    P = result["largest_fitting_batch"]
    assert P >= 14 and result["logical_batch"] == 4 * P  # the limit is what 16 samples need
    for name in ("accumulate", "recompute"):
        side = result["sides"][name]
        assert side["fits"] and side["micro_batch"] <= P and side["vs_plain"] > 0
