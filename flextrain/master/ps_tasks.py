"""Training-task hand-out for the ParameterServer strategy.

There is no rendezvous: every worker asks for training tasks on its own, like
evaluation tasks. A task is owned by the worker id that took it. A worker
reports a task done only after every gradient push of it was accepted by the
parameter servers; the master then completes it.

A worker's position (heartbeats, GetTask) carries, in PS mode, the id of the
task it is on as ``task_index`` and the minibatches of it whose pushes were
accepted as ``steps_done``. When the worker dies, :func:`release_worker` keeps
those minibatches as applied and requeues only the rest. Minibatches pushed
after its last report are not applied again: every push names its task and
records, each PS applies a task's records once, and the worker taking over
the task skips what every PS already has (flextrain/worker/ps_trainer.py).

Resume: :func:`save_ledger` writes the ledger to ``<job_dir>/ps-ledger.json``
(every status period and when the master ends) and :func:`resume_ledger`
reads it back. Any moment's ledger is a safe point to resume from: what it
calls done is on every PS (a task is reported done after all its pushes were
accepted, and a PS loses nothing it acknowledged, see flextrain/ps/wal.py),
and what it still owes but the PS already applied is skipped, not applied
again (tasks keep their ids across a resume).

Evaluation (:func:`ps_evaluation_task`): the worker whose push reached a
version ``k * --evaluation-steps`` asks for that evaluation's tasks; the
model only moves forward on the PS, so a task of the evaluation of version
``v`` may go to any worker holding a model at version >= ``v``: a worker
starting a later evaluation first takes what is left of earlier ones (e.g.
requeued when their worker died), and at the end (every worker holds the
final model) the final evaluators take every leftover.

Once every training task is done the model lives on the parameter servers,
which checkpoint themselves: the PS checkpoint directory stands for the
"final checkpoint" the job's outcome waits for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from flextrain.master.checkpoints import (StateFileError, StateWriteError, read_json_checked,
                                          write_json_atomic)
from flextrain.master.evaluation import evaluation_task
from flextrain.master.jobdir import finished_message
from flextrain.master.evaluation import task_message as evaluation_task_message
from flextrain.master.ledger import Task, TaskKind
from flextrain.master.strategy import TrainingStrategy
from flextrain.master.stragglers import shrink
from flextrain.proto import flextrain_pb2 as pb


def task_message(task: Task) -> pb.Task:
    kind = pb.Task.TRAINING if task.kind is TaskKind.TRAINING else pb.Task.EVALUATION
    return pb.Task(task_id=task.task_id, kind=kind, source=task.source, start=task.start, end=task.end,
                   epoch=task.epoch, global_batch_size=task.global_batch_size)


def ps_training_task(job, worker_id: str) -> pb.GetTaskResponse:
    """Answer one worker's GetTask(TRAINING) in PS mode; the caller holds ``job.cond``.

    RUN (a task now owned by ``worker_id``), WAIT (other workers still hold the
    last tasks: one of them may fail and be requeued), NO_MORE (training is over
    for good: go on to evaluation) or STOP (the job is over or stopping).
    """
    if job.over or job.stopping or worker_id in job.retiring:
        return pb.GetTaskResponse(action=pb.GetTaskResponse.STOP, message=job.message)
    task = job.ledger.next_training_task(owner=worker_id)
    if task is not None:
        G = task.global_batch_size or 1  # whole minibatches: a straggler's share is cut at a step boundary
        if (size := shrink(job, worker_id, task.size)) < task.size:
            job.ledger.trim(task.task_id, max(G, size - size % G))
        job.mark_running()
        return pb.GetTaskResponse(action=pb.GetTaskResponse.RUN, task=task_message(task))
    if job.ledger.training_finished():
        if job.final_checkpoint is None:
            job.final_checkpoint = str(job.spec.ps_checkpoint_dir)
        return pb.GetTaskResponse(action=pb.GetTaskResponse.NO_MORE, message=job.message)
    return pb.GetTaskResponse(action=pb.GetTaskResponse.WAIT)


def ps_evaluation_task(job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
    """Answer GetTask(EVALUATION) in PS mode; the caller holds ``job.cond`` (see the module docstring).

    Before the evaluation the worker asks for, it gets a task left of a running
    evaluation of a version it has reached (any, once training finished);
    otherwise :func:`flextrain.master.evaluation.evaluation_task` answers.
    """
    evals, ledger = job.evaluations, job.ledger
    final = ledger.training_finished()
    if ledger.evaluation_shards and not final and evals.periodic(req.model_version):
        evals.start(req.model_version)
    for version in sorted(evals.running):
        if not final and version > req.model_version:
            break
        task = ledger.next_evaluation_task(req.worker_id, model_version=version)
        if task is not None:
            job.mark_running()
            return pb.GetTaskResponse(action=pb.GetTaskResponse.RUN, task=evaluation_task_message(task))
    response = evaluation_task(job, req)
    if final and response.action == pb.GetTaskResponse.NO_MORE and ledger.pending(TaskKind.EVALUATION):
        return pb.GetTaskResponse(action=pb.GetTaskResponse.WAIT)  # an earlier evaluation's holder may fail
    return response


def release_worker(job, worker_id: str) -> None:
    """Requeue what ``worker_id`` (gone) held, keeping the minibatches it reported as pushed.

    The caller holds ``job.cond``. A task whose id is not the one in the worker's
    last position goes back whole (nothing of it is known to be applied).
    """
    info = job.workers.get(worker_id)
    for task in [t for t in job.ledger.doing.values() if t.owner == worker_id]:
        pushed = 0
        if info is not None and task.kind is TaskKind.TRAINING and info.position.task_index == task.task_id:
            pushed = int(info.position.steps_done)
        job.ledger.interrupt(task.task_id, pushed)


LEDGER_FILE = "ps-ledger.json"
PREVIOUS_LEDGER_FILE = "ps-ledger.previous.json"  # the one before: a resume falls back to it


def save_ledger(job) -> Path:
    """Write the ledger (and whether training finished) for ``--resume``: atomic, with a CRC-32;
    the file it replaces stays as ``ps-ledger.previous.json``. A failed write (a full disk) fails the job."""
    with job.cond:
        data = {"ledger": job.ledger.to_dict(), "training_finished": job.ledger.training_finished()}
    path = Path(job.spec.job_dir) / LEDGER_FILE
    try:
        if path.is_file():  # keep the previous ledger (any moment's is a safe point, see above)
            link = path.with_name(f".{PREVIOUS_LEDGER_FILE}.tmp-{os.getpid()}")
            try:
                link.unlink(missing_ok=True)
                os.link(path, link)
                os.replace(link, path.with_name(PREVIOUS_LEDGER_FILE))
            except OSError:  # no hard links here: no previous ledger either
                link.unlink(missing_ok=True)
        write_json_atomic(path, data, checksum=True)  # temp file, fsync, rename; a CRC-32 the resume checks
    except StateWriteError as exc:  # e.g. a full disk: the previous file is kept
        job.fail(None, f"cannot save the task ledger: {exc}")
    return path


def resume_ledger(job, *, relocate: Callable[[dict], dict] = lambda state: state) -> str | None:
    """Restore the ledger :func:`save_ledger` wrote; None, or why the job cannot resume.

    A ledger file that fails its checksum or does not fit the job is named and the previous
    one used (with a note); with neither usable the resume is refused, naming both. ``relocate``
    re-roots a moved job directory's task sources (flextrain/master/resume.py). A job that
    finished training is refused unless its epochs were extended."""
    path = Path(job.spec.job_dir) / LEDGER_FILE
    previous = path.with_name(PREVIOUS_LEDGER_FILE)
    if not path.is_file() and not previous.is_file():
        job.note(f"no {LEDGER_FILE} in {job.spec.job_dir}: the task ledger starts over; the parameter servers "
                 "restore their shards and skip the records they applied already")
        return None
    damaged: list[str] = []
    for candidate in (path, previous):
        try:
            data = read_json_checked(candidate)
            state = relocate(data["ledger"])
            job.ledger.check_state(state)
        except FileNotFoundError:
            continue
        except StateFileError as exc:
            damaged.append(str(exc))
            continue
        except (ValueError, KeyError, TypeError) as exc:  # LedgerStateError: the ledger does not fit the job
            damaged.append(f"{candidate}: {type(exc).__name__}: {exc}")
            continue
        job.ledger.restore(state)
        if data.get("training_finished") is True and job.ledger.training_finished():
            return finished_message(job.spec.job_dir, job.spec.training.epochs, str(job.spec.ps_checkpoint_dir))
        if damaged:
            job.note(f"damaged task ledger skipped: {'; '.join(damaged)}; using {candidate}")
        job.note(f"resumed from {candidate}: {job.ledger.records_done} of {job.ledger.records_total} records "
                 "done; the parameter servers restore their shards")
        return None
    return f"cannot resume: no usable task ledger: {'; '.join(damaged)}"


class ParameterServerStrategy(TrainingStrategy):
    """Independent workers pushing to parameter servers (module docstring): no rounds, a task per
    worker, the task ledger saved for ``--resume`` (the servers checkpoint the model themselves)."""

    def training_task(self, job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        response = ps_training_task(job, req.worker_id)
        job.check_outcome()
        return response

    def evaluation_task(self, job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        return ps_evaluation_task(job, req)

    def worker_left(self, job, worker_id: str) -> None:
        release_worker(job, worker_id)

    def stops_at_once(self, job) -> bool:
        return not job.ledger.training_finished()  # the model is on the PS: no stop checkpoint to wait for

    def restore(self, job, store, *, relocate: Callable[[dict], dict]) -> str | None:
        return resume_ledger(job, relocate=relocate)

    def save(self, job) -> None:
        save_ledger(job)
