"""Fixtures for the elastic tests: the process-wide state that ``init`` publishes, reset per test."""

from __future__ import annotations

import pytest

from flextrain.elastic import session as session_mod
from flextrain.elastic.session import ATTRIBUTES


@pytest.fixture
def fresh_init(monkeypatch):
    """Each test starts as a script does before its first ``init``: every attribute None, no current
    Session, no launcher environment; whatever the test's ``init`` sets is undone afterwards."""
    import flextrain.elastic.torch as elastic

    for name in ATTRIBUTES:
        monkeypatch.setattr(elastic, name, None)
    monkeypatch.setattr(session_mod, "_current", None)
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    return elastic
