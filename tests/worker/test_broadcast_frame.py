"""``Collective.broadcast_bytes`` across two real processes (gloo on loopback): payloads that fit the
first collective's frame and those that need a second one arrive whole, and a task answer takes one
collective, not two (a length, then the bytes, used to be two sync points per task boundary)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch.distributed as dist

from flextrain.worker import collective as collective_module
from flextrain.worker.collective import BROADCAST_FRAME, Collective

PAYLOADS = [b"", b"task" * 25, bytes(range(256)) * (BROADCAST_FRAME // 256),
            b"y" * (BROADCAST_FRAME + 1), os.urandom(300_000)]

PEER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from flextrain.worker.collective import Collective
    port, files = int(sys.argv[1]), sys.argv[2:]
    payloads = [Path(f).read_bytes() for f in files]
    c = Collective(timeout=60.0)
    c.join_round(host="127.0.0.1", port=port, round_id=1, rank=1, world_size=2)
    got = [c.broadcast_bytes(None) for _ in payloads]
    c.leave()
    sys.exit(0 if got == payloads else 1)
""")


def test_payloads_of_every_size_arrive_whole_and_a_small_one_takes_one_collective(monkeypatch, tmp_path):
    calls = []
    broadcast = dist.broadcast
    monkeypatch.setattr(collective_module.dist, "broadcast", lambda t, **kw: calls.append(t.numel()) or
                        broadcast(t, **kw))
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    files = []
    for i, payload in enumerate(PAYLOADS):
        files.append(tmp_path / f"payload-{i}")
        files[-1].write_bytes(payload)
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(store.port), *map(str, files)])
    try:
        c = Collective(timeout=60.0)
        c.join_round(host="127.0.0.1", port=store.port, round_id=1, rank=0, world_size=2)
        sent = [c.broadcast_bytes(p) for p in PAYLOADS]
        c.leave()
        assert peer.wait(timeout=60) == 0, "rank 1 did not receive the same bytes"
    finally:
        peer.kill()
    assert sent == PAYLOADS
    # Up to BROADCAST_FRAME bytes: one collective (length and bytes together); beyond: a second for the rest.
    head = 8 + BROADCAST_FRAME
    assert calls == [head, head, head, head, 1, head, 300_000 - BROADCAST_FRAME]
