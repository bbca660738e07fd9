"""Fixtures for the parameter-server tests: real gRPC servers on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def start_cluster():
    """``start_cluster(num_ps, **start_ps kwargs) -> (handles, PSClient factory)``; all stopped afterwards."""
    from flextrain.ps.main import start_ps
    from flextrain.worker.ps_client import PSClient

    handles, clients = [], []

    def start(num_ps: int = 1, **kwargs):
        hs = [start_ps(shard_index=i, num_ps=num_ps, host="127.0.0.1", **kwargs) for i in range(num_ps)]
        handles.extend(hs)

        def client(**ckw) -> PSClient:
            c = PSClient([h.address for h in hs], **{"give_up": 5.0, "deadline": 10.0, **ckw})
            clients.append(c)
            return c
        return hs, client

    yield start
    for c in clients:
        c.close()
    for h in handles:
        h.stop(grace=0.2, checkpoint=False)


@pytest.fixture
def spawn_ps(tmp_path):
    """``spawn_ps(*cli_args, name=...) -> (process, address)``: a real PS process
    (``python -m flextrain.ps.main``); the ones still running are killed afterwards."""
    procs: list[subprocess.Popen] = []

    def spawn(*args: str, name: str = "ps") -> tuple[subprocess.Popen, str]:
        addr = tmp_path / f"{name}.addr"
        addr.unlink(missing_ok=True)
        log = tmp_path / f"{name}.log"  # a file, not a pipe: a full pipe would block the PS
        with open(log, "a") as err:
            proc = subprocess.Popen([sys.executable, "-m", "flextrain.ps.main", "--host", "127.0.0.1",
                                     "--address-file", str(addr), *args],
                                    cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                    stdout=subprocess.DEVNULL, stderr=err)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while not addr.exists():
            if proc.poll() is not None:
                raise AssertionError(f"PS exited with {proc.returncode}: {log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError("PS did not write its address file within 30 s")
            time.sleep(0.02)
        return proc, addr.read_text().strip()

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
