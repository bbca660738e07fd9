"""Run a script of this directory as two real gloo ranks (WORLD_SIZE/RANK/MASTER_ADDR/MASTER_PORT, as
torchrun sets them) and read the JSON each writes to the file named by its first argument."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(tmp_path: Path, script: str, *args: str, timeout: float = 240) -> list[dict]:
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([str(HERE), *(p for p in sys.path if p)]))
    procs = [subprocess.Popen([sys.executable, str(HERE / script), str(tmp_path / f"rank{r}.json"), *args],
                              env={**base, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out[-6000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
