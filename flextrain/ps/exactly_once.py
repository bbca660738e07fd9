"""What a PS shard accepted, so that no push and no minibatch is applied twice (no gRPC, no locking).

Contracts:

* **per push**: the ``(client_id, seq)`` of each client's latest push is kept
  with its answer; a retry of that push gets the same answer, an older push a
  rejection. Clients are forgotten least recently used first beyond
  ``_CLIENTS`` (only a client's latest push matters).
* **per minibatch**: per task, the end of the records accepted; a push whose
  minibatch (``step = (task_id, start, end)``) starts before it is a
  duplicate, answered accepted with nothing applied. Tasks are forgotten
  least recently used first beyond ``_TASKS`` (only recent ones get requeued).
  The tasks are saved in checkpoints; the clients are not (the write-ahead log
  replays the pushes themselves).
* **thread safety**: none of its own; the shard calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from flextrain.ps.settings import PushResult

_CLIENTS = 4096    # clients remembered for push de-duplication (LRU)
_TASKS = 1 << 17   # tasks whose accepted minibatches are remembered (LRU)


class AcceptedPushes:
    """The latest push per client and the accepted records per task of one shard."""

    def __init__(self, tasks: Iterable[tuple[int, int]] = ()) -> None:
        self._clients: OrderedDict[str, tuple[int, PushResult]] = OrderedDict()
        self._until: OrderedDict[int, int] = OrderedDict((int(t), int(u)) for t, u in tasks)

    def answered(self, client_id: str, seq: int, version: int) -> PushResult | None:
        """The answer to push ``seq`` of ``client_id`` if it is not new (a retry or older), else None."""
        last = self._clients.get(client_id) if client_id else None
        if last is None or seq > last[0]:
            return None
        if seq == last[0]:
            return last[1]  # a retry of a push already handled
        return PushResult(False, version, f"push {seq} of client {client_id} is older than its latest push {last[0]}")

    def duplicate(self, step: tuple[int, int, int] | None, version: int) -> PushResult | None:
        """The answer to a push of minibatch ``step`` whose records were accepted before, else None."""
        until = self._until.get(step[0]) if step is not None else None
        if until is None or step[1] >= until:
            return None
        return PushResult(True, version, f"records [{step[1]}, {step[2]}) of task {step[0]} were already accepted",
                          duplicate=True)

    def accept_step(self, step: tuple[int, int, int]) -> None:
        """Records ``[start, end)`` of task ``step[0]`` were accepted."""
        self._until[step[0]] = step[2]
        self._until.move_to_end(step[0])
        if len(self._until) > _TASKS:
            self._until.popitem(last=False)

    def answer(self, client_id: str, seq: int, result: PushResult) -> None:
        """Remember ``result`` as the answer to push ``seq`` of ``client_id`` (no client id: nothing)."""
        if client_id:
            self._clients[client_id] = (seq, result)
            self._clients.move_to_end(client_id)
            if len(self._clients) > _CLIENTS:
                self._clients.popitem(last=False)

    def progress(self, task_id: int) -> int:
        """The end of the records accepted for ``task_id`` (-1: none known)."""
        return self._until.get(task_id, -1)

    def tasks(self) -> list[tuple[int, int]]:
        """(task id, end of the records accepted), least recently accepted first (for checkpoints)."""
        return list(self._until.items())
