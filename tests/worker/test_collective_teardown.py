"""A peer SIGKILLed inside an all-reduce: the survivors' CollectiveError carries no frames of the failed
call (they hold the broken group, whose gloo teardown must not run on the training thread), the group
is left before the error reaches the caller, and the survivors form the next round over the same
store and sum correctly in it. Real processes, real gloo on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist

MEMBER = r"""
import json, sys, torch
from flextrain.worker.collective import Collective, CollectiveError
port, rank, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = Collective(timeout=30.0)
c.join_round(host="127.0.0.1", port=port, round_id=0, rank=rank, world_size=3)
open(f"{out}/ready-{rank}", "w").close()
t = torch.ones(1000)
try:
    while True:
        c.all_reduce_sum(t)
        t.fill_(1.0)
except CollectiveError as exc:
    error = exc
result = {"cause": repr(error.__cause__), "context": repr(error.__context__), "message": str(error)[:200],
          "initialized": torch.distributed.is_initialized()}
c.join_round(host="127.0.0.1", port=port, round_id=1, rank=rank, world_size=2)  # the survivors' round
x = torch.full((4,), float(rank + 1))
c.all_reduce_sum(x)
result.update({"sum": x.tolist(), "rank": c.rank, "world": c.world_size})
c.leave()
print(json.dumps(result))
"""


def test_survivors_of_a_killed_peer_raise_without_frames_and_form_the_next_round(tmp_path: Path):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER, str(store.port), str(rank), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in range(3)]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{r}").exists() for r in range(3)):
            assert time.monotonic() < deadline, "the round of 3 did not form"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.05)
        procs[2].send_signal(signal.SIGKILL)
        results = []
        for p in procs[:2]:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in results:
        assert r["message"].startswith("all_reduce in round 0 failed"), r
        assert r["cause"] == "None" and r["context"] == "None", r  # no frames of the failed call kept
        assert not r["initialized"], r  # left before the error reached the caller
        assert r["world"] == 2 and r["sum"] == [3.0] * 4, r  # 1 + 2: the survivors' new round sums right
    assert sorted(r["rank"] for r in results) == [0, 1]
