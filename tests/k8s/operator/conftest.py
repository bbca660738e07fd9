"""Fixtures of the operator and CLI tests (the cluster fixtures are tests/k8s/conftest.py's)."""

from __future__ import annotations

import os
import subprocess

import pytest
from ft_helpers import flextrain_cmd

from flextrain.k8s import meta


@pytest.fixture
def cli(k8s_cluster):
    """``cli(*args)``: the real ``flextrain`` CLI in a child process, KUBECONFIG pointing at the emulator."""
    def run(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)}
        env.pop(meta.ENV_NAMESPACE, None)
        return subprocess.run(flextrain_cmd(*args), capture_output=True, text=True, timeout=120, env=env, check=False)
    return run
