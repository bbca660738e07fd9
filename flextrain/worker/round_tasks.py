"""A round's training tasks: rank 0 asks the master, the other members get its answer.

Every member of a round runs the same task indices with the same answers
(``master/lockstep.py`` memoizes them by index). Asking for them is the
master's heaviest load at scale: every member asking for each task at the same
moment is a burst of one call per member (bench/master_scale.py). So only rank
0 of the round calls GetTask for training tasks, ahead during a task's last
step and plainly at a task boundary, exactly as each member used to; the others
never do. At the task boundary where rank 0 has asked, the round runs one more
collective on its own process group: rank 0 broadcasts the answer (the
``GetTaskResponse``'s protobuf bytes: nothing is pickled) and every member
decodes the same one. Tasks an answer brought along (``more``) are queued on
every member alike, so the members agree, without a word, on which boundaries
carry a broadcast.

A round's first task usually comes with the rendezvous answer itself
(``JoinRendezvousResponse.first_task``, the same in every member's): no ask,
no broadcast, on a recovery's path.

Asks: a plain ask takes tasks ahead too (``count``), and an answer that
brought fewer tasks than asked means the master had no more free ones (the
job's last tasks are all handed out, or a remainder is held elsewhere): rank
0 then makes no ahead ask when they run out, whose answer would be a WAIT,
and asks plainly at the boundary instead. The master cuts the next epoch as
soon as none of the current one's tasks is TODO, so an epoch's end costs no
plain ask: the ahead asks carry on into the next epoch.

Failure semantics are those of any collective of the round: a member (rank 0
too) that dies before or during the broadcast makes it fail on the others
(:class:`~flextrain.worker.collective.CollectiveError`), and they re-join; the
master settles the round's tasks by the survivors' positions, which the joins
carry (the ledger's owner of a training task is the round, not a worker).
What rank 0 learnt from the master (END_ROUND, STOP, NO_MORE) reaches every
member at the same boundary, as the memoized answers did. Evaluation tasks are
not lockstep and every worker still asks for its own.
"""

from __future__ import annotations

import math

import grpc

from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.client import MasterClient
from flextrain.worker.collective import Collective
from flextrain.worker.state import WorkerState

RUN = pb.GetTaskResponse.RUN
# Ask ahead for enough tasks to last about this long (at most MAX_AHEAD): every GetTask
# wakes dozens of gRPC threads across worker and master, each preempting a compute thread.
AHEAD_SECONDS = 2.0
MAX_AHEAD = 32


class RoundTasks:
    """The answers for task indices 0, 1, ... of the round this worker is in (see the module docstring)."""

    def __init__(self, *, client: MasterClient, collective: Collective, state: WorkerState) -> None:
        self.client = client
        self.collective = collective
        self.state = state
        # The next task, asked for during the current task's last step (rank 0): (task index, future).
        self._ahead: tuple[int, grpc.Future] | None = None
        self._queued: dict[int, pb.Task] = {}  # tasks of later indices an answer brought along (every member)
        self._task_seconds = 0.0  # how long a task takes (moving average; 0: not measured yet)
        self.tasks_ahead = self.tasks_asked = 0  # tasks answered ahead / by a plain ask (rank 0)
        self.ahead_asks = 0  # GetTask calls made ahead (rank 0)
        self.handed = 0  # answers received from rank 0 (the other members)
        self._first_round = -1  # the round whose first task ask_first asked for
        self._given: tuple[int, pb.Task] | None = None  # (round, its first task) from the rendezvous answer
        self.given = 0  # first tasks that came with the rendezvous answer (no ask, no broadcast)
        self._count = 1  # how many tasks rank 0's latest ask asked for
        self._short = False  # the last answer brought fewer tasks than asked: the master had no more free

    def reset(self, *, keep_first: bool = False) -> None:
        """A round begins or ends: tasks handed out but not started are settled with the round
        (``keep_first``: but not the new round's first task, asked by :meth:`ask_first`)."""
        self._queued.clear()
        self._short = False
        if self._ahead is not None and not (keep_first and self._ahead[0] == 0 and self._first_round == self.state.round_id):
            self._ahead[1].cancel()  # an answer already given is settled with the round
            self._ahead = None

    def ask_first(self, *, rank: int, given: pb.Task | None = None) -> None:
        """The rendezvous answered with ``rank`` in the new round, and ``given``, the round's first task
        when the master decided it as the round formed (every member has it then: nobody asks, nothing
        is broadcast). Otherwise rank 0 asks for it now, ahead, so that the answer travels while the
        round's group forms and its state syncs."""
        self.reset()
        self._given = (self.state.round_id, given) if given is not None else None
        if rank != 0 or given is not None:
            return
        self.ahead_asks += 1
        self._first_round = self.state.round_id
        self._count = self._ahead_count()
        self._ahead = (0, self.client.get_task_ahead(round_id=self.state.round_id, task_index=0,
                                                     position=self.state.position(), count=self._count))

    def timed(self, seconds: float) -> None:
        """A task took ``seconds``: how many tasks an ahead ask takes follows from it."""
        self._task_seconds = seconds if not self._task_seconds else 0.7 * self._task_seconds + 0.3 * seconds

    # ---- rank 0: asking the master --------------------------------------------------
    def ask_ahead(self) -> None:
        """During the current task's last step, rank 0 asks for the next task, so the answer
        travels while the step computes (one RPC per task otherwise stalls the step after it)."""
        index = self.state.task_index + 1
        if self.collective.rank != 0 or self.state.end_round.is_set() or self.state.stop.is_set() \
                or index in self._queued or self._short:
            # not ours to ask, the round ends at this boundary anyway, the task is already here, or
            # the master had no free task left when it last answered (an ahead ask would get a WAIT)
            return
        self.ahead_asks += 1
        self._count = self._ahead_count()
        self._ahead = (index, self.client.get_task_ahead(round_id=self.state.round_id, task_index=index,
                                                         position=self.state.position(), count=self._count))

    def _ahead_count(self) -> int:
        """How many tasks to take at once: about AHEAD_SECONDS of work (one until a task is timed)."""
        if not self._task_seconds:
            return 1
        return max(1, min(MAX_AHEAD, math.ceil(AHEAD_SECONDS / self._task_seconds)))

    def _ask(self, index: int) -> pb.GetTaskResponse:
        """Rank 0: the ahead answer for task ``index`` if it runs a task, else a plain ask."""
        pending, self._ahead = self._ahead, None
        if pending is not None and pending[0] == index:
            try:
                resp = pending[1].result()
            except grpc.RpcError:  # e.g. the master restarting: the plain ask retries
                resp = None
            if resp is not None and resp.action == RUN:
                self.tasks_ahead += 1
                return resp
        self.tasks_asked += 1
        self._count = self._ahead_count()
        return self.client.get_task(round_id=self.state.round_id, task_index=index, position=self.state.position(),
                                    count=self._count)

    # ---- every member -------------------------------------------------------------------
    def answer(self, index: int) -> pb.GetTaskResponse:
        """The round's answer for task ``index``: queued, or asked by rank 0 and broadcast to the round."""
        if index == 0 and self._given is not None and self._given[0] == self.state.round_id:
            task, self._given = self._given[1], None
            self.given += 1
            return pb.GetTaskResponse(action=RUN, task=task)
        if (task := self._queued.pop(index, None)) is not None:
            self.tasks_ahead += self.collective.rank == 0
            return pb.GetTaskResponse(action=RUN, task=task)
        resp = self._ask(index) if self.collective.rank == 0 else None
        if self.collective.world_size > 1:
            self.state.waiting = True  # on rank 0's ask, or on the slowest member
            try:
                blob = self.collective.broadcast_bytes(resp.SerializeToString() if resp is not None else None)
            finally:
                self.state.waiting = False
            if resp is None:
                resp = pb.GetTaskResponse.FromString(blob)
                self.handed += 1
        if resp.action == RUN:
            self._queued = {index + 1 + i: task for i, task in enumerate(resp.more)}
            # (rank 0 only: the others never ask)
            self._short = self.collective.rank == 0 and len(resp.more) + 1 < self._count
        return resp


__all__ = ["AHEAD_SECONDS", "MAX_AHEAD", "RoundTasks"]
