"""bench/spares.py's arithmetic: the ratio of medians baseline / spares and its bootstrap interval."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from spares import ratio_ci  # noqa: E402


def test_ratio_of_medians_with_an_interval_around_it():
    out = ratio_ci([10.0, 12.0, 14.0], [0.1, 0.2, 0.4])
    assert out["ratio"] == 60.0  # 12 / 0.2
    low, high = out["ci95"]
    assert low <= 60.0 <= high and low >= 10.0 / 0.4 and high <= 14.0 / 0.1
    assert ratio_ci([], [0.1]) == {"ratio": None, "ci95": None}
