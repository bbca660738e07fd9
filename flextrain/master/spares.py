"""The job's spare workers (``--spare-workers K``): started ahead, parked, taken when needed.

A spare is an ordinary worker process (or pod) launched with ``--spare``: it
loads the module and builds the model and optimizer like any worker, then
parks in the ``Park`` long poll instead of registering. A spare is not a
member, is not in the rendezvous and reads no tasks; status shows spares apart
from the workers. A scale-up or the replacement of a lost worker *takes* a
spare (:meth:`SparePool.take`): its next ``Park`` answer is TAKEN, and it
registers and joins the next round as newcomers do. The instance manager then
launches a new spare behind it.

This class only keeps the books (which spares exist, which have parked,
which were taken) and tells a listener when a parked spare's answer changed;
launching is the instance manager's, the long poll the servicer's.
"""

from __future__ import annotations

import threading
from typing import Callable

from flextrain.proto import flextrain_pb2 as pb

TAKEN, STOP = pb.ParkResponse.TAKEN, pb.ParkResponse.STOP


class SparePool:
    """Spares by state: ``starting`` (launched, not parked yet), ``parked``, ``taken`` (not yet told)."""

    def __init__(self, wanted: int) -> None:
        if wanted < 0:
            raise ValueError(f"spare workers must be 0 or more, not {wanted}")
        self.wanted = wanted
        self._lock = threading.Lock()
        self._starting: list[str] = []  # launch order: the oldest is the likeliest to be ready
        self._parked: dict[str, int] = {}  # worker id -> pid, in the order they parked
        self._taken: set[str] = set()  # taken while starting or parked; Park answers TAKEN once
        self.closed = False
        self.taken_total = 0
        self.listeners: list[Callable[[], None]] = []  # called (no lock held) when a Park answer changed

    # ---- the instance manager's side --------------------------------------------
    def launched(self, worker_id: str) -> None:
        with self._lock:
            self._starting.append(worker_id)

    def take(self) -> str | None:
        """The spare a scale-up or a replacement gets (a parked one first, else the oldest still starting),
        now no longer a spare; None when there is none."""
        with self._lock:
            if self.closed:
                return None
            if self._parked:
                worker_id = next(iter(self._parked))
                del self._parked[worker_id]
            elif self._starting:
                worker_id = self._starting.pop(0)
            else:
                return None
            self._taken.add(worker_id)
            self.taken_total += 1
        self._changed()
        return worker_id

    def exited(self, worker_id: str) -> str | None:
        """Forget an instance that exited: ``"parked"`` or ``"starting"`` when it was a spare in that
        state, None when it was not a spare (a worker, or a spare already taken)."""
        with self._lock:
            self._taken.discard(worker_id)
            if worker_id in self._parked:
                del self._parked[worker_id]
                return "parked"
            if worker_id in self._starting:
                self._starting.remove(worker_id)
                return "starting"
            return None

    def missing(self) -> int:
        """How many spares to launch to have ``wanted`` of them (0 once closed)."""
        with self._lock:
            return 0 if self.closed else max(0, self.wanted - len(self._starting) - len(self._parked))

    def close(self) -> None:
        """The job is over: every parked spare is answered STOP and exits by itself."""
        with self._lock:
            self.closed = True
        self._changed()

    # ---- the servicer's side ----------------------------------------------------
    def park(self, worker_id: str, pid: int) -> int | None:
        """A spare's Park poll: TAKEN, STOP, or None (stay parked). An id this pool does not know (its
        master restarted, or it was never a spare) is answered STOP: nothing would ever take it."""
        with self._lock:
            if worker_id in self._taken:
                self._taken.discard(worker_id)
                return TAKEN
            if self.closed:
                return STOP
            if worker_id in self._starting:
                self._starting.remove(worker_id)
                self._parked[worker_id] = pid
            return None if worker_id in self._parked else STOP

    def is_spare(self, worker_id: str) -> bool:
        with self._lock:
            return worker_id in self._parked or worker_id in self._starting

    def ids(self) -> set[str]:
        """The spares (not yet taken)."""
        with self._lock:
            return set(self._starting) | set(self._parked)

    def snapshot(self) -> dict:
        """What status.json shows: spares wanted, parked (ready to be taken) and still starting."""
        with self._lock:
            return {"desired": self.wanted, "parked": len(self._parked), "starting": len(self._starting),
                    "pids": sorted(self._parked.values()), "taken": self.taken_total}

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()
