"""Fixtures of the evaluation tests (helpers in evalcases.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalcases import write_csv


@pytest.fixture
def validation(tmp_path) -> Path:
    """x = 0..99 over two files: mean x 49.5, accuracy 0.8."""
    write_csv(tmp_path / "validation" / "a.csv", range(0, 60))
    write_csv(tmp_path / "validation" / "b.csv", range(60, 100))
    return tmp_path / "validation"
