"""A short gloo all-reduce between two processes over the job's TCPStore (``--node-check``'s link probe).

Both sides call :func:`all_reduce_probe` with the same ``prefix``: the master as rank 0 (on a thread of
its own, answering a worker's ProbeLink), the new worker as rank 1. Each builds a two-member gloo group
under ``PrefixStore(prefix)`` of the job's long-lived TCPStore — the way rounds form theirs — and
all-reduces ``rounds`` + 1 float32 tensors of ``nbytes`` (the first untimed: the connection's set-up).
The worker's figure is the median timed round's seconds per MiB: its link's all-reduce speed, which the
master compares with the workers admitted before it (flextrain/master/stragglers.py).
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

MIB = 1 << 20
MAX_BYTES = 64 << 20  # per round: a probe is short by design
MAX_ROUNDS = 10


def all_reduce_probe(*, host: str, port: int, prefix: str, rank: int, nbytes: int, rounds: int,
                     timeout: float = 30.0) -> float:
    """Run the probe as ``rank`` (0 or 1); returns the median timed round's seconds per MiB."""
    import torch
    import torch.distributed as dist

    if not 0 < nbytes <= MAX_BYTES or not 0 < rounds <= MAX_ROUNDS:
        raise ValueError(f"link probe: {nbytes} bytes x {rounds} rounds is outside (0, {MAX_BYTES}] x (0, {MAX_ROUNDS}]")
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
    group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, timedelta(seconds=timeout))
    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    group.allreduce([tensor]).wait()  # set-up, untimed
    took = []
    for _ in range(rounds):
        began = time.perf_counter()
        group.allreduce([tensor]).wait()
        took.append(time.perf_counter() - began)
    return statistics.median(took) / (nbytes / MIB)  # the median: one round held up by a busy CPU is no verdict


__all__ = ["MAX_BYTES", "MAX_ROUNDS", "MIB", "all_reduce_probe"]
