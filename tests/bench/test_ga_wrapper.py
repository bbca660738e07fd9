"""bench/ga_wrapper.py: its pairing arithmetic, and one small run end to end (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from ga_wrapper import paired_ratios  # noqa: E402


def test_each_block_is_paired_with_the_hand_blocks_around_it():
    series = [("hand", 10.0), ("wrapper", 9.0), ("control", 12.0), ("hand", 8.0), ("wrapper", 8.0)]
    assert paired_ratios(series, "wrapper") == [pytest.approx(1.0), pytest.approx(1.0)]  # 9/mean(10,8), 8/8
    assert paired_ratios(series, "control") == [pytest.approx(12 / 9)]
    assert paired_ratios([("wrapper", 1.0)], "wrapper") == []  # nothing to pair with


def test_a_small_run_prints_one_json_object():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    out = subprocess.run([sys.executable, str(BENCH / "ga_wrapper.py"), "--rounds", "2", "--block", "1",
                          "--features", "8", "--hidden", "16"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bench"] == "ga_wrapper"
    assert set(result["cases"]) == {"cnn-even", "cnn-uneven", "mlp-even", "mlp-uneven"}
    assert result["cases"]["cnn-uneven"]["micro_batches"] == [63, 63, 62, 62]
    assert result["target_cases"] == ["cnn-even", "cnn-uneven"]
    for case in result["cases"].values():
        assert case["wrapper_vs_hand"] > 0 and len(case["wrapper_vs_hand_ci95"]) == 2
        assert case["scaled_vs_hand"] > 0 and case["scaled_steps_per_s"] > 0
    assert isinstance(result["met"], bool)
