"""Exactly-once accounting: from where workers stand to what the ledger records.

A round's members report positions (round, task index, steps committed in
that task, model version). These functions turn positions into ledger
outcomes: which tasks of a closed round are done, which are applied in part
(the remainder is requeued), and which ledger state matches a checkpoint.
They are pure with respect to the master: the caller holds its lock.
"""

from __future__ import annotations

from typing import Iterable

from flextrain.master.ledger import TaskLedger
from flextrain.master.rendezvous import Round, RoundState
from flextrain.proto import flextrain_pb2 as pb

RUN = pb.GetTaskResponse.RUN


def most_advanced(positions: Iterable[pb.Position], round_id: int) -> pb.Position | None:
    """The position, among those inside ``round_id``, with the highest model version."""
    inside = [p for p in positions if p.round_id == round_id]
    return max(inside, key=lambda p: p.version, default=None)


def commit_passed(ledger: TaskLedger, rnd: Round | None, position: pb.Position) -> None:
    """A member of ``rnd`` standing at ``position`` has committed every step of the round's
    tasks before ``position.task_index``; so has every member (lockstep), so they are done.

    Positions are the only commit signal once a worker asks for its next task ahead of
    time (``GetTaskRequest.ahead``); a settled (closed) round is left to ``settle_round``.
    """
    if rnd is None or rnd.state is RoundState.CLOSED or position.round_id != rnd.round_id:
        return
    upto = min(position.task_index, len(rnd.answers))
    for action, task_id in rnd.answers[rnd.committed:upto]:
        if action == RUN and task_id in ledger.doing:
            rnd.settled[task_id] = ledger.complete(task_id).steps
    rnd.committed = max(rnd.committed, upto)


def settle_round(ledger: TaskLedger, old: Round, best: pb.Position | None) -> None:
    """Account the tasks a closed round took by its most advanced survivor.

    Tasks before the survivor's task are done; its task is applied up to its
    committed steps; later ones (and all, without a survivor) go back whole.
    """
    for index, (action, task_id) in enumerate(old.answers):
        if action != RUN or task_id not in ledger.doing:
            continue
        if best is None or index > best.task_index:
            ledger.interrupt(task_id, 0)
        elif index < best.task_index:
            ledger.complete(task_id)
        else:
            ledger.interrupt(task_id, best.steps_done)


def task_failed(rnd: Round | None, task_id: int, steps_done: int) -> None:
    """A task of ``rnd`` failed with ``steps_done`` steps applied (the ledger requeued the rest)."""
    if rnd is not None and rnd.state is not RoundState.CLOSED:
        rnd.settled[task_id] = steps_done


def moved_past(ledger: TaskLedger, rnd: Round, pos: pb.Position) -> bool:
    """Whether the ledger holds an outcome of ``rnd`` that a model at ``pos`` (of that round) does not
    have, so that :func:`ledger_at` cannot give that model's ledger: the task at ``pos`` left DOING with
    other than ``pos.steps_done`` steps applied (completed while the model is inside it, failed at a
    later step), or a later task left DOING with any step applied. A task that left DOING unrecorded
    counts as moved past."""
    for index in range(pos.task_index, len(rnd.answers)):
        action, task_id = rnd.answers[index]
        if action != RUN or task_id in ledger.doing:
            continue
        if rnd.settled.get(task_id) != (pos.steps_done if index == pos.task_index else 0):
            return True
    return False


def ledger_at(ledger: TaskLedger, current: Round | None, pos: pb.Position) -> dict:
    """The ledger snapshot matching a model that committed exactly up to ``pos``."""
    if current is None or current.round_id != pos.round_id or pos.task_index >= len(current.answers):
        return ledger.snapshot()
    action, task_id = current.answers[pos.task_index]
    task = ledger.doing.get(task_id)
    if action != RUN or task is None:
        return ledger.snapshot()
    if pos.steps_done >= task.steps:
        return ledger.snapshot(done_task=task_id)
    return ledger.snapshot(partial=(task_id, pos.steps_done))


def snapshot_ledger(ledger: TaskLedger, rnd: Round | None, current: Round | None, pos: pb.Position, *,
                    beyond: bool) -> dict | None:
    """The ledger state of an in-memory snapshot's model at ``pos``, or None when the ledger already
    holds an outcome that model lacks (the snapshot must not be used).

    ``rnd``: the snapshot's round when the master still knows it (the current one, or one that was
    current when the master last looked); its tasks before ``pos`` that are still DOING count as done
    (the model applied them; no member has reported so yet). Without it (an older round) the
    answer is exact only while the current round started at the snapshot's version and nothing
    beyond it was committed (``beyond``: a member of ``current`` reported a later version)."""
    if rnd is None:
        if current is None or current.version != pos.version or beyond:
            return None
        return ledger.snapshot()
    if moved_past(ledger, rnd, pos):
        return None
    state = ledger_at(ledger, rnd, pos)
    applied = {task_id for action, task_id in rnd.answers[:pos.task_index]
               if action == RUN and task_id in ledger.doing}
    if applied:
        kept = []
        for entry in state["todo"]:
            if entry["task_id"] in applied:
                state["records_done"] += entry["end"] - entry["start"]
            else:
                kept.append(entry)
        state["todo"] = kept
    return state
