"""Training-task hand-out for AllReduce rounds: every member gets the same answers.

The round's tasks are asked for by index, in order; the first ask for an
index decides the answer (``Round.answers`` memoizes it) and every later ask
gets that same answer, even after the job ended, so all members leave a
round, or finish, at the same task boundary. Workers have only rank 0 of a
round ask and broadcast each answer to the others over the round's group
(``flextrain/worker/round_tasks.py``): one call per task instead of a burst
of one per member. Any member may still ask; the answers are the same. The
round, not a worker, owns the tasks it was handed (``owner="round-N"``):
when any member fails, the round's survivors settle them (``rounds.py``).

Committing: a member whose position stands at task ``i`` has committed every
step of the tasks before it, and so has every member (lockstep), so those
tasks are done (``accounting.commit_passed``, on every position the master
hears: rank 0's asks, every member's heartbeats and joins). A plain ask for
task ``i`` carries that position itself.

Ahead (``GetTaskRequest.ahead``): rank 0 asks for task ``i + 1`` during task
``i``'s last step, so the answer is there when the step ends. Only a RUN is
decided that early; a round that is closing, a job that is stopping, or no
free task (the last epoch's tasks all handed out; the next epoch's are cut as
soon as none of this one's is TODO, so an epoch's end is no boundary here)
answers WAIT and decides nothing, and the worker asks again, plainly, once its
task is done. An ahead ask commits nothing it has not committed; if
the round ends before the early task starts, settlement puts it back whole.

An ahead ask may take several tasks (``ahead_count``): the answers for
indices ``i, i+1, ...`` are decided at once, RUNs only, and come back as
``task`` and ``more``. A plain ask may too (rank 0 asks so at a round's
first task when the rendezvous answer did not bring it, or after an ahead
ask's WAIT): its own answer is decided as always, and only when it is a RUN
are free tasks after it decided early, as an ahead ask would. Each is memoized by its index like any other, so every
member still gets the same tasks in the same order; settlement treats those
not yet started like any early task. This is what keeps fast steps from
paying a GetTask every fraction of a second.
"""

from __future__ import annotations

import logging
from typing import Callable

from flextrain.master.accounting import commit_passed
from flextrain.master.checkpoints import CheckpointError, CheckpointStore
from flextrain.master.evaluation import evaluation_task, task_message
from flextrain.master.jobdir import finished_message
from flextrain.master.rendezvous import Round, RoundState
from flextrain.master.strategy import TrainingStrategy
from flextrain.proto import flextrain_pb2 as pb

log = logging.getLogger(__name__)

RUN, WAIT, END_ROUND, NO_MORE, STOP = (pb.GetTaskResponse.RUN, pb.GetTaskResponse.WAIT,
                                       pb.GetTaskResponse.END_ROUND, pb.GetTaskResponse.NO_MORE,
                                       pb.GetTaskResponse.STOP)


def lockstep_task(job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
    """Answer a member's GetTask for training task ``req.task_index`` (the caller holds the lock)."""
    rnd = job.assigned.get(req.worker_id)
    index = req.task_index
    if rnd is not None and rnd.round_id == req.round_id and index < len(rnd.answers):
        pass  # answered before
    elif job.over:
        return pb.GetTaskResponse(action=STOP, message=job.message)
    elif rnd is None or rnd.round_id != req.round_id or rnd.state is RoundState.CLOSED:
        return pb.GetTaskResponse(action=END_ROUND)
    if index > len(rnd.answers):
        raise ValueError(f"{req.worker_id} asked for task {index} of round {rnd.round_id} out of order")
    count = max(1, req.ahead_count)
    if req.ahead:
        _decide_early(job, rnd, upto=index + count)
        if index == len(rnd.answers):
            return pb.GetTaskResponse(action=WAIT)
    elif index == len(rnd.answers):
        commit_passed(job.ledger, rnd, pb.Position(round_id=rnd.round_id, task_index=index))
        rnd.answers.append(_decide(job, rnd))
        job.check_outcome()
    if not req.ahead and rnd.answers[index][0] == RUN:  # the tasks after it too, as an ahead ask takes them
        _decide_early(job, rnd, upto=index + count)  # (also after an answer decided as the round formed)
    action, task_id = rnd.answers[index]
    if action == RUN:
        task = job.ledger.doing.get(task_id)
        if task is None:  # failed and requeued meanwhile; the round must re-form
            return pb.GetTaskResponse(action=END_ROUND)
        return pb.GetTaskResponse(action=action, task=task_message(task),
                                  more=_running(job, rnd, index + 1, index + count))
    return pb.GetTaskResponse(action=action, message=job.message)


def _decide_early(job, rnd: Round, *, upto: int) -> None:
    """Decide answers up to index ``upto`` (exclusive) ahead of time: RUNs of free tasks only."""
    if job.over or job.stopping or rnd.state is not RoundState.ACTIVE:
        return
    while len(rnd.answers) < upto:
        task = job.ledger.next_training_task(owner=f"round-{rnd.round_id}")
        if task is None:
            return
        rnd.answers.append((RUN, task.task_id))


def _running(job, rnd: Round, lo: int, hi: int) -> list[pb.Task]:
    """The tasks answered for indices ``lo..hi-1``, up to the first that is not a running RUN."""
    tasks = []
    for action, task_id in rnd.answers[lo:hi]:
        task = job.ledger.doing.get(task_id) if action == RUN else None
        if task is None:
            break
        tasks.append(task_message(task))
    return tasks


def _decide(job, rnd: Round) -> tuple[int, int]:
    if job.over or job.stopping:
        return STOP, -1
    if rnd.state is RoundState.CLOSING:
        return END_ROUND, -1
    task = job.ledger.next_training_task(owner=f"round-{rnd.round_id}")
    if task is not None:
        return RUN, task.task_id
    if job.ledger.training_finished():
        return NO_MORE, -1
    return END_ROUND, -1


class AllReduceStrategy(TrainingStrategy):
    """Rounds of lockstep workers: every member of a round gets the same task answers
    (:func:`lockstep_task`); rounds form as workers come and go (``JobMaster.form_round``)."""

    def training_task(self, job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        return lockstep_task(job, req)

    def evaluation_task(self, job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        return evaluation_task(job, req)

    def round_formed(self, job, rnd: Round, previous: Round | None, waiters: list) -> None:
        """Settle the last round, then decide the new round's first task as an ahead ask would
        (a RUN of a free task, or nothing): it goes out with every member's rendezvous answer."""
        super().round_formed(job, rnd, previous, waiters)
        _decide_early(job, rnd, upto=1)
        if rnd.answers:
            rnd.first_task = task_message(job.ledger.doing[rnd.answers[0][1]])

    def worker_left(self, job, worker_id: str) -> None:
        job.ledger.release_owner(worker_id)

    def tick(self, job) -> None:
        job.form_round()  # a round may be due by time alone (the straggler timeout)

    def restore(self, job, store: CheckpointStore, *, relocate: Callable[[dict], dict]) -> str | None:
        """The newest checkpoint whose files pass their checks (damaged ones are named in a note and
        skipped): its ledger, and the checkpoint the first round's rank 0 loads."""
        root = job.spec.job_dir
        job.flush_flash(why="resuming")  # a job whose workers (and master) were killed: its newest in-memory snapshot
        try:
            latest, damaged = store.resume_point(check=lambda state: job.ledger.check_state(relocate(state)))
        except CheckpointError as exc:
            return f"cannot resume {root}: {exc}"
        if latest is None:
            job.note(f"no checkpoint in {store.directory}: starting from the beginning")
            return None
        if damaged:
            job.note(f"damaged checkpoint state skipped: {'; '.join(damaged)}; using {latest['checkpoint']} "
                     f"(step {latest['version']})")
            log.warning("%s", job.events[-1])
        job.ledger.restore(relocate(latest["ledger"]))
        if latest["final"] and job.ledger.training_finished():
            return finished_message(root, job.spec.training.epochs, latest["checkpoint"],
                                    model_def=job.spec.model_def, validation=job.spec.data.validation)
        job.restore_checkpoint, job.step = latest["checkpoint"], latest["version"]
        job.note(f"resumed from {latest['checkpoint']} (step {latest['version']})")
        return None
