"""A local worker's memory limit (``--worker-memory-limit``), enforced the way a container's is.

Kubernetes kills a container over its memory limit (the kernel's cgroup OOM killer: SIGKILL) and
reports ``OOMKilled`` as its terminated reason. Local workers get the same: :class:`RssWatch` samples
the resident set size of each watched process every ``interval`` seconds (``/proc/PID/statm``) and
kills one over the limit with SIGKILL, recording ``OOMKilled`` as the reason the launch backend gives
for its exit. The master then treats it as it treats an OOMKilled pod (flextrain/master/oom.py).

Why RSS sampling and not ``RLIMIT_AS``: the address-space limit counts virtual memory, which torch's
allocator arenas, thread stacks and mapped libraries reserve far beyond what is resident (and CUDA
reserves tens of GiB), so a byte figure meaning "memory" kills at import or never; and going over it
makes an allocation raise inside the worker (MemoryError, a RuntimeError from torch), which user code
may catch, instead of ending the process with a cause the master can read. Resident memory is what a
cgroup limits. The price: a peak shorter than ``interval`` can pass unseen (a real cgroup limit, where
one is set, still applies).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from flextrain.master.k8s_outcomes import OOM_KILLED  # the terminated reason of a container over its limit

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

log = logging.getLogger(__name__)


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes; None when it is gone (or /proc is not there)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class RssWatch:
    """Kill (``kill(instance_id)``) any process of ``watched()`` (instance id -> pid) whose resident memory
    exceeds ``limit`` bytes; ``reasons`` keeps ``OOMKilled`` for each one killed."""

    def __init__(self, limit: int, *, watched: Callable[[], dict[str, int]], kill: Callable[[str], None],
                 interval: float = 0.05) -> None:
        self.limit = limit
        self._watched, self._kill, self.interval = watched, kill, interval
        self.reasons: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for instance_id, pid in self._watched().items():
                rss = rss_bytes(pid)
                if rss is not None and rss > self.limit and instance_id not in self.reasons:
                    self.reasons[instance_id] = OOM_KILLED
                    log.warning("%s (pid %d) uses %d bytes, over its memory limit of %d: killing it (OOMKilled)",
                                instance_id, pid, rss, self.limit)
                    self._kill(instance_id)

    def close(self) -> None:
        self._stop.set()


__all__ = ["RssWatch", "rss_bytes"]
