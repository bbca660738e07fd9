"""AllReduce rendezvous: who trains together, in which round, with which rank.

A *round* is one fixed membership: round id, members in rank order, and the
model version it starts from. Every membership change ends the round; the
survivors and newcomers join again and a new round is formed:

* a member's collective failed (a peer died): it joins with reason
  ``collective_failed`` and the round is closed at once;
* a worker arrived, or the desired count changed: the master asks members
  (heartbeat ``end_round``) to leave at the next step boundary;
* the launch backend saw a member exit.

A new round is formed once at least ``min_workers`` are waiting and either
every worker the master believes alive is waiting, ``max_workers`` are
waiting, or ``timeout`` seconds passed since the first one (stragglers do
not hold a round up for ever). Rank 0 goes to the waiting worker with the
highest model version; it broadcasts model and optimizer state to the rest,
so a newcomer starts from the same state and survivors that disagree by one
step (a peer died inside the last collective) are brought level. When every
member is a survivor of the last round, synced in it and at the round's
version (:func:`members_in_sync`), they hold that state already: the round
says so and nothing is broadcast (a recovery's regroup is then the group's
formation alone).

Each round memoizes its answers to "task number i": every member asks for
the same indices in order and gets the same task, so members stay in
lockstep without talking to each other. This class is pure bookkeeping; the
master calls it under its own lock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from flextrain.proto import flextrain_pb2 as pb


class RoundState(enum.Enum):
    ACTIVE = "active"
    CLOSING = "closing"  # members were asked to leave at the next step boundary
    CLOSED = "closed"


@dataclass
class Round:
    round_id: int
    members: list[str]
    version: int
    restore_checkpoint: str = ""
    store_port: int = 0  # the round's own TCPStore (script jobs); 0: the job's store, under a round prefix
    max_micro_batch: int = 0  # M every member plans with (flextrain.master.memory.MicroBatchChoice)
    members_in_sync: bool = False  # every member holds the round's starting state: no broadcast
    first_task: pb.Task | None = None  # answer 0, decided as the round formed: in every member's join answer
    state: RoundState = RoundState.ACTIVE
    # Memoized GetTask answers, by task index: (action, task id or -1).
    answers: list[tuple[int, int]] = field(default_factory=list)
    committed: int = 0  # answers[:committed] are known committed (see accounting.commit_passed)
    # Tasks of this round that left DOING while it was current: task id -> the steps of it the ledger
    # counts as applied (all of a completed task, those before the failure of a failed one). What tells
    # whether the ledger has moved past an in-memory snapshot's position (accounting.moved_past).
    settled: dict[int, int] = field(default_factory=dict)
    _ranks: dict = field(default_factory=dict, repr=False, compare=False)  # worker -> rank (rank_of)

    def rank_of(self, worker_id: str) -> int:
        if len(self._ranks) != len(self.members):  # members are fixed once the round forms
            self._ranks = {w: i for i, w in enumerate(self.members)}
        return self._ranks[worker_id]

    @property
    def world_size(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class Waiter:
    worker_id: str
    position: pb.Position
    since: float


def members_in_sync(rnd: Round, previous: Round | None, waiters: list[Waiter]) -> bool:
    """Whether every member of ``rnd`` (formed of ``waiters`` after ``previous``) already holds the
    state the round starts from, so no broadcast is needed: each finished ``previous``'s state sync
    (``Position.synced``; lockstep keeps the members identical from there) and stands at the round's
    version (each committed the same steps). A newcomer (never synced, round -1), a member back from
    an older round, one that died in the previous sync, or a checkpoint to restore: not in sync."""
    if previous is None or rnd.restore_checkpoint:
        return False
    return all(w.position.synced and w.position.round_id == previous.round_id
               and w.position.version == rnd.version for w in waiters)


class Rendezvous:
    def __init__(self, *, min_workers: int, max_workers: int, timeout: float) -> None:
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.timeout = timeout
        self.current: Round | None = None
        self.waiting: dict[str, Waiter] = {}
        self._first: float | None = None  # the earliest ``since`` of the waiters (None: to compute)
        self.next_round_id = 0

    def join(self, worker_id: str, position: pb.Position, now: float) -> Round | None:
        """Register a waiting worker; returns the round it closed, if any."""
        closed = None
        rnd = self.current
        if rnd is not None and rnd.state is not RoundState.CLOSED and worker_id in rnd.members:
            rnd.state = RoundState.CLOSED
            closed = rnd
        if worker_id not in self.waiting:
            self.waiting[worker_id] = Waiter(worker_id, position, now)
            if self._first is not None:
                self._first = min(self._first, now)
        return closed

    def request_end(self) -> None:
        """Ask the active round's members to leave at the next step boundary."""
        if self.current is not None and self.current.state is RoundState.ACTIVE:
            self.current.state = RoundState.CLOSING

    def drop(self, worker_id: str) -> Round | None:
        """A worker is gone for good; returns the round this closed, if any."""
        self._unwait(worker_id)
        rnd = self.current
        if rnd is not None and rnd.state is not RoundState.CLOSED and worker_id in rnd.members:
            rnd.state = RoundState.CLOSED
            return rnd
        return None

    def drop_waiter(self, worker_id: str) -> None:
        self._unwait(worker_id)

    def _unwait(self, worker_id: str) -> None:
        if self.waiting.pop(worker_id, None) is not None:
            self._first = None

    def ready(self, alive: set[str], now: float, *, launched: set[str] = frozenset()) -> bool:
        """Whether a round is due: ``alive`` (and ``launched``: the first round waits for every worker
        started too) all waiting, ``max_workers`` waiting, or the straggler timeout passed."""
        if self.current is not None and self.current.state is not RoundState.CLOSED:
            return False
        n = len(self.waiting)
        if n < self.min_workers:
            return False
        # O(1) unless every worker alive may be waiting (the length test first: this runs at each change).
        if n >= self.max_workers or (n >= len(alive) and alive <= self.waiting.keys()
                                     and launched <= self.waiting.keys()):
            return True
        return now - self._first_since() >= self.timeout

    def due_at(self) -> float | None:
        """When waiting alone makes a round due (the straggler timeout); None: not by time."""
        if (self.current is not None and self.current.state is not RoundState.CLOSED) \
                or len(self.waiting) < self.min_workers:
            return None
        return self._first_since() + self.timeout

    def _first_since(self) -> float:
        """The earliest waiter's ``since``, kept between calls: readiness is asked at every change."""
        if self._first is None:
            self._first = min(w.since for w in self.waiting.values())
        return self._first

    def form(self, *, previous_round: int | None) -> tuple[Round, list[Waiter]]:
        """Form a round of the waiting workers; returns it and the waiters used.

        Survivors of ``previous_round`` rank first (highest version first): a
        worker back from an older round holds a state the job has moved past.
        """
        waiters = sorted(
            self.waiting.values(),
            key=lambda w: (w.position.round_id != previous_round, -w.position.version, w.since, w.worker_id),
        )[: self.max_workers]
        for w in waiters:
            del self.waiting[w.worker_id]
        self._first = None
        rnd = Round(
            round_id=self.next_round_id,
            members=[w.worker_id for w in waiters],
            version=waiters[0].position.version,
        )
        self.next_round_id += 1
        self.current = rnd
        return rnd, waiters
