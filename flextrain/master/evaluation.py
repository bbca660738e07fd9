"""Evaluation and prediction on the master: hand-out, aggregation, outcome.

An *evaluation* evaluates the model of one version (optimizer steps) on the
validation data; it is cut into evaluation tasks in the ledger, any worker
holding that model takes them, and the master adds up per-metric sums of
per-sample values and the sample counts. The metric is total sum / total
samples: the mean over every evaluated sample however tasks were spread.
Mergeable metrics (AUC) report additive states instead, summed the same way.

When evaluations happen:

* every ``--evaluation-steps N`` optimizer steps during AllReduce training:
  the round's members all reach version ``k*N`` in lockstep, each asks for
  evaluation tasks of that version (the model is identical on every member),
  and they return to training once the evaluation is complete (NO_MORE).
  Training state is untouched while they evaluate, so exactly-once holds; a
  member that dies mid-evaluation has its task requeued to a survivor, and
  the round breaks (as always) at the next gradient all-reduce.
* once after training (the *final* evaluation), of the final model; when the
  last periodic evaluation already evaluated that version it is not repeated.
* in an evaluation-only job (``flextrain evaluate``): the final evaluation of
  the checkpoint's model.

Evaluation tasks are not persisted: after a rollback or a resume an
unfinished evaluation is simply cut again when a worker reaches that version.
Finished evaluations are kept as history (``status.json`` ``evaluations``).

Prediction jobs (``flextrain predict``): workers take prediction tasks and
write one part file each (``flextrain/data/predictions.py``); when the last
is reported the master checks every part has one row per record and writes
the manifest. The functions taking ``job`` run with ``job.cond`` held.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flextrain.data.errors import DataError
from flextrain.data.predictions import FORMAT, MANIFEST, count_rows, part_name
from flextrain.data.sql import is_sql_url
from flextrain.data.sql_output import check_output_rows
from flextrain.elastic import metrics
from flextrain.job import JobType
from flextrain.master.checkpoints import write_json_atomic
from flextrain.master.ledger import Task, TaskKind, TaskLedger
from flextrain.proto import flextrain_pb2 as pb

log = logging.getLogger("flextrain.master")

RUN, WAIT, NO_MORE, STOP = (pb.GetTaskResponse.RUN, pb.GetTaskResponse.WAIT, pb.GetTaskResponse.NO_MORE,
                            pb.GetTaskResponse.STOP)


@dataclass
class _Sums:
    sums: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    states: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)  # mergeable: name -> (kind, sum)


class Evaluations:
    """Evaluations by model version: in progress (partial sums) and finished (history)."""

    def __init__(self, ledger: TaskLedger, *, every: int) -> None:
        self.ledger = ledger
        self.every = every
        self.running: dict[int, _Sums] = {}
        self.history: list[dict] = []  # finished: {"step", "metrics", "samples", "time"}
        self.final_step: int | None = None

    @property
    def done(self) -> set[int]:
        return {h["step"] for h in self.history}

    def periodic(self, version: int) -> bool:
        return bool(self.every) and version > 0 and version % self.every == 0

    def start(self, version: int) -> None:
        """Cut the evaluation of ``version`` unless it is running or finished."""
        if version in self.running or version in self.done:
            return
        self.running[version] = _Sums()
        if self.ledger.cut_evaluation(version) == 0:
            self._finish(version)

    def start_final(self, version: int) -> int:
        if self.final_step is None:
            self.final_step = version
            self.ledger.evaluation_cut = True
            self.start(version)
        return self.final_step

    def record(self, task: Task, sums: dict[str, float], samples: int,
               states: dict[str, tuple[str, np.ndarray]] | None = None) -> dict | None:
        """Add a finished task's sums (and mergeable metric states); returns the history
        entry when its evaluation completed."""
        acc = self.running.get(task.model_version)
        if acc is None:
            return None  # an evaluation abandoned by a rollback
        for name, value in sums.items():
            acc.sums[name] = acc.sums.get(name, 0.0) + value
        for name, (kind, state) in (states or {}).items():
            have = acc.states.get(name)
            if kind not in metrics.KINDS or (have is not None and (have[0] != kind or len(have[1]) != len(state))):
                log.warning("evaluation at step %d: metric %r: ignoring a %r state of %d values from task %d",
                            task.model_version, name, kind, len(state), task.task_id)
                continue
            acc.states[name] = (kind, state if have is None else have[1] + state)
        acc.samples += samples
        if self.ledger.pending(TaskKind.EVALUATION, task.model_version):
            return None
        return self._finish(task.model_version)

    def _finish(self, version: int) -> dict:
        acc = self.running.pop(version)
        values = {k: v / acc.samples for k, v in acc.sums.items()} if acc.samples else {}
        for name, (kind, state) in acc.states.items():
            value = metrics.result(kind, state)
            if np.isfinite(value):
                values[name] = value
            else:  # e.g. AUC over one class only: left out rather than a NaN in status.json
                log.warning("evaluation at step %d: metric %r is undefined on this data", version, name)
        entry = {"step": version, "metrics": values, "samples": acc.samples, "time": round(time.time(), 3)}
        self.history.append(entry)
        self.history.sort(key=lambda h: h["step"])
        return entry

    def forget_unfinished(self) -> None:
        """The ledger was restored (its evaluation tasks dropped): start over when asked again."""
        self.running.clear()
        if self.final_step is not None and self.final_step not in self.done:
            self.final_step = None


def describe(entry: dict) -> str:
    values = ", ".join(f"{k}={v:.4f}" for k, v in sorted(entry["metrics"].items())) or "no metrics"
    return f"evaluation at step {entry['step']}: {values} ({entry['samples']} samples)"


_KIND = {TaskKind.TRAINING: pb.Task.TRAINING, TaskKind.EVALUATION: pb.Task.EVALUATION,
         TaskKind.PREDICTION: pb.Task.PREDICTION}


def task_message(task: Task) -> pb.Task:
    return pb.Task(
        task_id=task.task_id, kind=_KIND[task.kind], source=task.source, start=task.start,
        end=task.end, epoch=task.epoch, global_batch_size=task.global_batch_size,
        model_version=task.model_version,
    )


# ---- RPC logic (called by JobMaster with job.cond held; it checks the outcome after) ----
def evaluation_task(job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
    """Answer GetTask(EVALUATION) for a worker holding the model at ``req.model_version``.

    RUN a task of that version's evaluation; NO_MORE once it is complete; WAIT
    while other workers hold its last tasks (one may fail) or, for a version
    that is not an evaluation step, until training is over.
    """
    evals: Evaluations = job.evaluations
    if not job.ledger.evaluation_shards:
        return pb.GetTaskResponse(action=NO_MORE)  # no validation data: nothing to evaluate
    final = job.ledger.training_finished()
    if final:
        version = evals.start_final(max(req.model_version, job.step))
    elif evals.periodic(req.model_version):
        version = req.model_version
        evals.start(version)
    else:
        return pb.GetTaskResponse(action=WAIT)  # training still runs: nothing to evaluate yet
    task = job.ledger.next_evaluation_task(req.worker_id, model_version=version)
    if task is not None:
        job.mark_running()
        return pb.GetTaskResponse(action=RUN, task=task_message(task))
    return pb.GetTaskResponse(action=NO_MORE if version in evals.done else WAIT)


def prediction_task(job, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
    """RUN a prediction task; WAIT while other workers hold the last ones (one may fail)."""
    task = job.ledger.next_prediction_task(req.worker_id)
    if task is not None:
        job.mark_running()
        return pb.GetTaskResponse(action=RUN, task=task_message(task))
    return pb.GetTaskResponse(action=NO_MORE if job.ledger.prediction_finished() else WAIT)


def record_task(job, task: Task, req: pb.ReportTaskRequest) -> None:
    """A successful evaluation or prediction task was reported."""
    if task.kind is TaskKind.PREDICTION and req.samples != task.size:
        job.ledger.fail(task.task_id, 0, f"{req.worker_id} wrote {req.samples} predictions for the "
                        f"{task.size} records of {task.source} [{task.start}, {task.end})")
        return
    job.ledger.complete(task.task_id)
    if task.kind is TaskKind.EVALUATION:
        states = {name: (m.kind, np.asarray(m.values, dtype=np.float64)) for name, m in req.metric_states.items()}
        entry = job.evaluations.record(task, dict(req.metric_sums), req.samples, states)
        if entry is not None:
            job.metrics.update(entry["metrics"])
            message = describe(entry)
            log.info("%s", message)
            job.events.append(message)
            if not job.over:
                job.message = message


def outcome(job) -> tuple[bool, str] | None:
    """Whether an evaluation/prediction job is over: ``(succeeded, message)``, or None while running."""
    spec = job.spec
    if spec.job_type is JobType.EVALUATION:
        if not job.ledger.evaluation_finished():
            return None
        entry = next((h for h in job.evaluations.history if h["step"] == job.evaluations.final_step), None)
        return True, describe(entry) if entry else "evaluation finished (no validation records)"
    if spec.job_type is JobType.PREDICTION:
        if not job.ledger.prediction_finished():
            return None
        try:
            if is_sql_url(spec.output):
                rows = check_output_rows(spec.output, job.ledger.prediction_plan)
            else:
                rows = write_manifest(job.ledger, Path(spec.output))
        except (OSError, DataError) as exc:
            return False, f"prediction output {spec.output} is incomplete: {exc}"
        return True, f"{rows} predictions written to {spec.output}"
    return None


def inference_progress(job) -> tuple[int, int]:
    """``(records done, records total)`` of an evaluation-only or prediction job."""
    ledger = job.ledger
    if job.spec.job_type is JobType.PREDICTION:
        total = sum(s.size for s in ledger.prediction_shards)
        return total - sum(t.size for t in ledger.pending(TaskKind.PREDICTION)), total
    total = sum(s.size for s in ledger.evaluation_shards)
    if not ledger.evaluation_cut:
        return 0, total
    return total - sum(t.size for t in ledger.pending(TaskKind.EVALUATION)), total


def write_manifest(ledger: TaskLedger, output: Path) -> int:
    """Check every part holds one row per record, write ``manifest.json``; returns the rows."""
    parts, total = [], 0
    for task_id, source, start, end in ledger.prediction_plan:
        path = output / part_name(task_id)
        if not path.is_file():
            raise OSError(f"{path} is missing")
        rows = count_rows(path)
        if rows != end - start:
            raise OSError(f"{path} holds {rows} rows for the {end - start} records of {source} [{start}, {end})")
        parts.append({"file": path.name, "source": source, "start": start, "end": end, "rows": rows})
        total += rows
    for leftover in output.glob(".part-*.tmp"):  # written by workers that died mid-task
        leftover.unlink(missing_ok=True)
    write_json_atomic(output / MANIFEST, {"format": FORMAT, "rows": total, "parts": parts})
    return total
