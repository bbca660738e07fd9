"""The accelerate tests run as one process (the 2-process ones start their own): no launcher environment."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
