"""The rules between a JobSpec's fields: each ``check_*(spec)`` raises JobSpecError naming the flags.

:meth:`flextrain.job.JobSpec.validate` runs them after each field's own rule; its
``cross_field_problems`` runs every one of them to report all problems of an ElasticJob at once.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from flextrain.job.settings import (
    Backend,
    JobSpecError,
    JobType,
    Strategy,
    check_accelerate_job,
    check_adaptive,
    check_auto_micro_batch,
    check_non_negative,
    check_ps_mode,
    flag_of,
    is_int,
)

if TYPE_CHECKING:
    from flextrain.job.spec import JobSpec


def check_worker_range(spec: JobSpec) -> None:
    """min_workers <= workers <= max_workers, blaming only flags that were given.

    An unset bound defaults to --workers, so it can never be the culprit:
    ``--workers 3 --max-workers 2`` is about --workers and --max-workers.
    """
    lo, n, hi = spec.worker.min_replicas, spec.worker.replicas, spec.worker.max_replicas
    if lo is not None and hi is not None:
        if lo > hi:
            raise JobSpecError(f"--min-workers ({lo}) is greater than --max-workers ({hi})")
        if not lo <= n <= hi:
            raise JobSpecError(f"--workers ({n}) must lie between --min-workers ({lo}) and --max-workers ({hi})")
    elif lo is not None and lo > n:
        raise JobSpecError(f"--min-workers ({lo}) is greater than --workers ({n})")
    elif hi is not None and n > hi:
        raise JobSpecError(f"--workers ({n}) is greater than --max-workers ({hi})")

def check_script(spec: JobSpec) -> None:
    """Exactly one of a model-zoo module and a script; a script job takes its data itself."""
    if spec.script is not None and not isinstance(spec.script, str):
        raise JobSpecError(f"the script must be a path, got {spec.script!r}")
    if not isinstance(spec.script_args, tuple) or not all(isinstance(a, str) for a in spec.script_args):
        raise JobSpecError(f"the script's arguments must be strings, got {spec.script_args!r}")
    if spec.script and spec.model_def:
        raise JobSpecError(f"a job runs a module (--model-def {spec.model_def}) or a script "
                           f"({spec.script}), not both")
    if not spec.script and spec.script_args:
        raise JobSpecError("script arguments need a script")
    if not spec.script and not spec.model_def:
        raise JobSpecError("--model-def is required (e.g. model_zoo/digits_torch.py:Model)")
    if spec.script:
        if spec.job_type is not JobType.TRAINING or spec.strategy is not Strategy.ALLREDUCE:
            raise JobSpecError("a script job trains with the AllReduce strategy "
                               f"(got {spec.job_type.value}, {spec.strategy.value})")
        for field in ("training_data", "validation_data", "prediction_data"):
            if spec.get(field):
                raise JobSpecError(f"{flag_of(field)} applies to module jobs; a script reads its own data")

def check_job_type(spec: JobSpec) -> None:
    if spec.script:
        return  # _validate_script
    if spec.job_type is JobType.TRAINING:
        if not spec.data.training:
            raise JobSpecError("--training-data is required")
    else:
        if spec.strategy is not Strategy.ALLREDUCE:
            raise JobSpecError(f"{spec.job_type.value} jobs run without --distribution-strategy "
                               f"(got {spec.strategy.value})")
        if not spec.checkpoint:
            raise JobSpecError(f"--checkpoint is required for an {spec.job_type.value} job "
                               "(a checkpoint file or a training job's directory)")
    if spec.job_type is JobType.EVALUATION and not spec.data.validation:
        raise JobSpecError("--validation-data is required for an evaluation job")
    if spec.job_type is JobType.PREDICTION:
        if not spec.data.prediction:
            raise JobSpecError("--prediction-data is required for a prediction job")
        if not spec.output:
            raise JobSpecError("--output is required for a prediction job (directory for the predictions)")
    if spec.training.evaluation_steps and not spec.data.validation:
        raise JobSpecError(f"--evaluation-steps {spec.training.evaluation_steps} needs --validation-data")
    if spec.training.evaluation_steps and spec.job_type is not JobType.TRAINING:
        raise JobSpecError("--evaluation-steps applies to training jobs only")

def check_schedule(spec: JobSpec) -> None:
    """A batch schedule and an LR rule are for AllReduce training jobs of a module (a script
    schedules its own batches through flextrain.elastic); what the trace holds is checked by
    whoever can read it (``flextrain train``, the operator for inline text, the master)."""
    training = spec.training
    check_adaptive(batch_schedule=training.batch_schedule, lr_rule=training.lr_rule,
                   min_global_batch=training.min_global_batch, max_global_batch=training.max_global_batch,
                   adapt_every=training.adapt_every)
    if training.batch_schedule is None and training.lr_rule == "none":
        return
    what = "--batch-schedule" if training.batch_schedule is not None else f"--lr-rule {training.lr_rule}"
    if spec.script:
        raise JobSpecError(f"{what} applies to module jobs; a script schedules its batches through "
                           "flextrain.elastic")
    if spec.job_type is JobType.TRAINING and spec.strategy is not Strategy.ALLREDUCE:
        raise JobSpecError(f"{what} needs --distribution-strategy AllReduce (lockstep steps of one global "
                           f"batch); got {spec.strategy.value}")

def check_micro_batch(spec: JobSpec) -> None:
    check_auto_micro_batch(max_micro_batch=spec.training.max_micro_batch, memory_limit=spec.training.memory_limit,
                           strategy=spec.strategy, job_type=spec.job_type, script=spec.script)

def check_accelerate(spec: JobSpec) -> None:
    check_accelerate_job(accelerate=spec.training.accelerate, strategy=spec.strategy, job_type=spec.job_type,
                         script=spec.script)

def check_ps(spec: JobSpec) -> None:
    if spec.strategy is Strategy.PARAMETER_SERVER:
        if not is_int(spec.ps.replicas) or spec.ps.replicas < 1:
            raise JobSpecError(
                f"--distribution-strategy ParameterServer needs --ps N (N >= 1 parameter servers), "
                f"got {spec.ps.replicas!r}")
    else:
        check_non_negative("--ps", spec.ps.replicas)
        if spec.ps.replicas:
            raise JobSpecError(f"--ps {spec.ps.replicas} needs --distribution-strategy ParameterServer "
                               f"(the strategy is {spec.strategy.value})")
    check_ps_mode("--ps-mode", spec.ps.ps_mode)
    if spec.ps.ps_mode == "async" and is_int(spec.ps.grads_to_wait) and spec.ps.grads_to_wait > 1:
        raise JobSpecError(f"--grads-to-wait {spec.ps.grads_to_wait} applies to --ps-mode sync (a PS averaging "
                           "that many pushes into one update); an async PS applies every push at once: drop one "
                           "of them")
    if spec.ps.ps_wal_fsync is True and spec.ps.ps_wal is False:
        raise JobSpecError("--ps-wal-fsync flushes the PS write-ahead log, which --no-ps-wal turns off: "
                           "drop one of them")


def check_spares(spec: JobSpec) -> None:
    """--spare-workers: a number of parked AllReduce workers of a module training job."""
    check_non_negative("--spare-workers", spec.worker.spares)
    if not spec.worker.spares:
        return
    if spec.script:
        raise JobSpecError("--spare-workers applies to module jobs: a script job restarts its script in each "
                           "round's world, so there is nothing built ahead to park")
    if spec.job_type is not JobType.TRAINING:
        raise JobSpecError(f"--spare-workers applies to training jobs, not a {spec.job_type.value} job")
    if spec.strategy is not Strategy.ALLREDUCE:
        raise JobSpecError(f"--spare-workers needs --distribution-strategy AllReduce (spares join a rendezvous "
                           f"round); got {spec.strategy.value}")


def check_node_check(spec: JobSpec) -> None:
    """--node-check times an AllReduce module's training step (a script job has no step the worker runs)."""
    if not spec.worker.node_check:
        return
    if spec.script:
        raise JobSpecError("--node-check applies to module jobs: a script job's step is the script's own")
    if spec.job_type is not JobType.TRAINING:
        raise JobSpecError(f"--node-check applies to training jobs, not a {spec.job_type.value} job")
    if spec.strategy is not Strategy.ALLREDUCE:
        raise JobSpecError(f"--node-check needs --distribution-strategy AllReduce; got {spec.strategy.value}")


def check_scheduling(spec: JobSpec) -> None:
    """A queue belongs to a gang scheduler, and Kueue admits only jobs that name their LocalQueue."""
    gang, queue = spec.scheduling.gang, spec.scheduling.queue
    if queue is not None and gang is None:
        raise JobSpecError(f"--queue {queue} needs --gang volcano or --gang kueue (whose queue it is)")
    if gang == "kueue" and queue is None:
        raise JobSpecError("--gang kueue needs --queue (the Kueue LocalQueue that admits the job)")


# In the order validate() runs them (check_script first, before any number is read).
_PASSWORD_IN_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@]*:[^@/?#]+@")


def check_data_urls(spec: JobSpec) -> None:
    """No password in a database URL (a job spec is stored and shown); --data-secret on Kubernetes only."""
    for field in ("training_data", "validation_data", "prediction_data"):
        value = spec.get(field)
        if isinstance(value, str) and _PASSWORD_IN_URL.match(value):
            raise JobSpecError(f"{flag_of(field)}: a database URL must not hold its password (the job spec is stored "
                               "and shown): locally set FLEXTRAIN_DATA_PASSWORD; on Kubernetes put it in a Secret "
                               "(key FLEXTRAIN_DATA_PASSWORD) and name the Secret with --data-secret")
    if spec.data.secret_ref is not None and spec.backend is not Backend.KUBERNETES:
        raise JobSpecError("--data-secret names a Kubernetes Secret, for Kubernetes jobs: a local job reads the "
                           "password from FLEXTRAIN_DATA_PASSWORD (or from the URL given to flextrain train)")


CROSS_FIELD = (check_script, check_worker_range, check_job_type, check_ps, check_schedule, check_micro_batch,
               check_accelerate, check_spares, check_node_check, check_data_urls, check_scheduling)

__all__ = ["CROSS_FIELD", "check_accelerate", "check_data_urls", "check_job_type", "check_micro_batch", "check_ps", "check_schedule", "check_scheduling", "check_script",
           "check_worker_range"]
