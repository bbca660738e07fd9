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
global batch, the LR factor of the rule, and the LR when the base is known;
under ``adascale`` the factor is the gain the workers measured and report
(with the gradient noise scale), 1 before they report one.
"""

from __future__ import annotations

import math

from flextrain.elastic.schedule import BatchSchedule, ScheduleError, lr_factor
from flextrain.job import JobSpec, JobSpecError
from flextrain.master.adaptive_batches import AdaptiveSchedule

INLINE_SOURCE = "--batch-schedule (inline)"


def job_schedule(spec: JobSpec) -> BatchSchedule | AdaptiveSchedule | None:
    """The job's trace, read and checked; an :class:`AdaptiveSchedule` (no decision yet) for
    ``adaptive``; None without one."""
    value = spec.training.batch_schedule
    if value is None:
        return None
    if spec.training.adaptive:
        return AdaptiveSchedule(min_global_batch=spec.training.min_global_batch,
                                max_global_batch=spec.training.max_global_batch, every=spec.training.adapt_every)
    try:
        if spec.training.inline_schedule:
            return BatchSchedule.parse(value, source=INLINE_SOURCE)
        return BatchSchedule.read(value.strip())
    except ScheduleError as exc:
        raise JobSpecError(str(exc)) from None


def global_batch_at(spec: JobSpec, schedule: BatchSchedule | None, step: int) -> int:
    """The global batch of optimizer step ``step`` (counted from 0 across epochs)."""
    return schedule.global_batch(step) if schedule is not None else spec.training.global_batch_size


def step_settings(spec: JobSpec, schedule: BatchSchedule | None, step: int, *,
                  adascale: tuple[float, float | None] | None = None) -> dict:
    """``{"globalBatchSize", "lrRule", "lrFactor"[, "learningRate"][, "gradientNoiseScale"]}`` of step
    ``step`` (status.json, the ElasticJob status). ``learningRate`` only when ``--lr`` set the base
    (else the module's own, which only the workers know: they log each change). Under ``adascale``,
    ``adascale`` is the workers' latest ``(gain, noise scale)``: the factor is the gain, and
    ``gradientNoiseScale`` (samples; the string "inf" while μ² is estimated as 0) is there once estimated."""
    G = global_batch_at(spec, schedule, step)
    rule = spec.training.effective_lr_rule
    if rule == "adascale":
        factor, noise = adascale or (1.0, None)
    else:
        factor, noise = lr_factor(rule, G, spec.training.effective_reference_batch_size), None
    out = {"globalBatchSize": G, "lrRule": rule, "lrFactor": round(factor, 6)}
    if noise is not None:
        out["gradientNoiseScale"] = round(noise, 3) if math.isfinite(noise) else str(noise)
    if spec.training.learning_rate is not None:
        out["learningRate"] = spec.training.learning_rate * factor
    if isinstance(schedule, AdaptiveSchedule):  # every decision (step, G), the last 100
        out["batchHistory"] = [[s, g] for s, g in schedule.history[-100:]]
    return out


__all__ = ["INLINE_SOURCE", "global_batch_at", "job_schedule", "step_settings"]
