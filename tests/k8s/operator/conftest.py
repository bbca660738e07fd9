"""Fixtures: the real operator against the emulated API server (see tests/k8s/operator_support.py)."""

from __future__ import annotations

import pytest
from operator_support import Jobs, Operator


@pytest.fixture
def operator(k8s_cluster, k8s_api):
    op = Operator(k8s_api, k8s_cluster.namespace, sweep_interval=1.0).start()
    yield op
    op.close()


@pytest.fixture
def jobs(k8s_cluster, k8s_api) -> Jobs:
    return Jobs(k8s_api, k8s_cluster.namespace)
