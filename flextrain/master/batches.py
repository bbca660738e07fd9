"""A job's batch schedule and LR rule, as the master and ``flextrain train`` read them.

``spec.training.batch_schedule`` is a path to a CSV trace ``step,batchsize``
or the trace's text inline (a value with a line break; what an ElasticJob
carries when the trace is not in a volume). :func:`job_schedule` reads it into
a :class:`~flextrain.elastic.schedule.BatchSchedule`, or raises
:class:`~flextrain.job.JobSpecError` naming the file (or ``--batch-schedule``)
and the line: ``flextrain train`` calls it before anything starts (exit 2),
the master at its start (a path inside the pods, which the operator cannot
read). Without a schedule every step's global batch is ``--global-batch-size``.

:func:`step_settings` is what status shows for the step in progress: its
global batch, the LR factor of the rule, and the LR when the base is known.
"""

from __future__ import annotations

from flextrain.elastic.schedule import BatchSchedule, ScheduleError, lr_factor
from flextrain.job import JobSpec, JobSpecError

INLINE_SOURCE = "--batch-schedule (inline)"


def job_schedule(spec: JobSpec) -> BatchSchedule | None:
    """The job's trace, read and checked; None without one."""
    value = spec.training.batch_schedule
    if value is None:
        return None
    try:
        if spec.training.inline_schedule:
            return BatchSchedule.parse(value, source=INLINE_SOURCE)
        return BatchSchedule.read(value.strip())
    except ScheduleError as exc:
        raise JobSpecError(str(exc)) from None


def global_batch_at(spec: JobSpec, schedule: BatchSchedule | None, step: int) -> int:
    """The global batch of optimizer step ``step`` (counted from 0 across epochs)."""
    return schedule.global_batch(step) if schedule is not None else spec.training.global_batch_size


def step_settings(spec: JobSpec, schedule: BatchSchedule | None, step: int) -> dict:
    """``{"globalBatchSize", "lrRule", "lrFactor"[, "learningRate"]}`` of step ``step`` (status.json,
    the ElasticJob status). ``learningRate`` only when ``--lr`` set the base (else the module's own,
    which only the workers know: they log each change)."""
    G = global_batch_at(spec, schedule, step)
    factor = lr_factor(spec.training.lr_rule, G, spec.training.effective_reference_batch_size)
    out = {"globalBatchSize": G, "lrRule": spec.training.lr_rule, "lrFactor": round(factor, 6)}
    if spec.training.learning_rate is not None:
        out["learningRate"] = spec.training.learning_rate * factor
    return out


__all__ = ["INLINE_SOURCE", "global_batch_at", "job_schedule", "step_settings"]
