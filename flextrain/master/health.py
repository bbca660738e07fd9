"""Telling a hung worker from a waiting one.

A worker's heartbeat thread keeps running when its training thread hangs,
so liveness alone proves nothing. Each heartbeat therefore says whether the
training thread is blocked on its peers (in a collective or the rendezvous:
waiting, not guilty) and how long it has made no progress. A worker that is
silent, or that makes no progress while *not* waiting on peers, for longer
than the limit is hung: the master kills it, which makes its peers' pending
collective fail at once, and the launcher replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Liveness:
    worker_id: str
    silent_for: float  # seconds since the last heartbeat or RPC
    stalled_for: float  # seconds without progress, as of the last heartbeat
    waiting_for_peers: bool


def find_hung(workers: list[Liveness], *, limit: float) -> list[tuple[str, str]]:
    """``(worker_id, reason)`` for every worker past ``limit`` seconds."""
    hung = []
    for w in workers:
        if w.silent_for > limit:
            hung.append((w.worker_id, f"no heartbeat for {w.silent_for:.0f}s, --worker-timeout {limit:g}s"))
        elif not w.waiting_for_peers and w.stalled_for + w.silent_for > limit:
            hung.append((w.worker_id, f"no progress for {w.stalled_for + w.silent_for:.0f}s, "
                                      f"--worker-timeout {limit:g}s"))
    return hung
