"""Read and ``feed`` the next step's records while the current step computes.

Within a round the world size is fixed, so a rank knows every step's record
span of a task in advance. :class:`StepLoader` loads step ``j+1`` in one
background thread while step ``j`` runs forward/backward/all-reduce: RecordIO
decoding (cramjam) and most of ``feed`` (numpy/torch) release the GIL, so on a
multi-core machine the load is hidden behind compute instead of adding to it.

Results are keyed by ``(task_id, start, end)``: a prefetch for a span nobody
asks for (the round ended, the world size changed, the task failed) is simply
dropped. An error raised while loading surfaces when that span is consumed, in
the training thread, exactly as if it had been loaded there.

Reading ahead pays only with a core to spare. When the compute threads keep
every core busy (CPU training with torch using all cores), the loader thread
can only preempt one of them, and the whole lockstep thread team waits for it:
the load costs as much as loading in the training thread, plus the thread
hand-offs (measured with ``bench/overhead.py`` on 2 cores: ~0.5 ms per step
more). :func:`read_ahead_wanted` decides; without a background thread
:meth:`StepLoader.prefetch` does nothing. A worker with peers then loads the
next span itself while its step's sums are in flight (:meth:`StepLoader.load_ahead`,
called by the trainer): time its thread would only spend waiting.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

Key = tuple[int, int, int]  # task_id, first record, end record
ENV_READ_AHEAD = "FLEXTRAIN_READ_AHEAD"  # "1"/"0": set by the local launcher, which knows who shares the cores


def read_ahead_wanted() -> bool:
    """``FLEXTRAIN_READ_AHEAD`` if set; else read ahead when training runs on a GPU (the cores
    are free while it computes) or when this process may use more cores than torch's threads."""
    raw = os.environ.get(ENV_READ_AHEAD, "").strip()
    if raw in ("0", "1"):
        return raw == "1"
    if torch.cuda.is_available():
        return True
    return len(os.sched_getaffinity(0)) > torch.get_num_threads()


class StepLoader:
    def __init__(self, load: Callable[..., Any], *, background: bool = True) -> None:
        """``load(task, start, end)`` returns whatever the trainer needs for that span;
        ``background=False``: no loader thread, :meth:`prefetch` is a no-op."""
        self._load = load
        self.background = background
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flextrain-prefetch") if background \
            else None
        self._pending: tuple[Key, Future] | None = None
        self.ahead = 0  # spans served from a prefetch
        self.now = 0    # spans loaded on the spot (a task's first step, a missed prefetch)

    def get(self, task, start: int, end: int):
        """The loaded span: the prefetched result if it matches, else loaded now."""
        key = (task.task_id, start, end)
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == key:
            self.ahead += 1
            return pending[1].result()
        if pending is not None:
            pending[1].cancel()
        self.now += 1
        return self._load(task, start, end)

    def prefetch(self, task, start: int, end: int) -> None:
        """Start loading a span the next :meth:`get` will probably ask for."""
        if self._pool is None:
            return
        if self._pending is not None:
            self._pending[1].cancel()
        if end <= start:
            self._pending = None
            return
        self._pending = ((task.task_id, start, end), self._pool.submit(self._load, task, start, end))

    def load_ahead(self, task, start: int, end: int) -> None:
        """Load a span the next :meth:`get` will probably ask for, now, in the calling thread: for a
        moment the thread would otherwise spend waiting (a collective in flight). An error is kept
        for :meth:`get` to raise, as a background load's is."""
        future: Future = Future()
        try:
            future.set_result(self._load(task, start, end))
        except Exception as exc:
            future.set_exception(exc)
        self._pending = ((task.task_id, start, end), future)

    def close(self) -> None:
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
