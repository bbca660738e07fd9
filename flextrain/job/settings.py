"""Every setting of a job by all its names, and the rules its values follow.

:data:`SETTINGS` is the one table (key ↔ JobSpec path ↔ flag ↔ ElasticJob path)
that the CLI, the operator's resource mapping, resume and the tests read;
``tests/job/test_settings_table.py`` checks it against the parser, the JobSpec
dataclasses and the CRD so the three cannot drift.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass


class JobSpecError(ValueError):
    """A job description that cannot run; the message names the field."""


class Strategy(str, enum.Enum):
    ALLREDUCE = "AllReduce"
    PARAMETER_SERVER = "ParameterServer"


class JobType(str, enum.Enum):
    """What a job does: ``flextrain train``, ``flextrain evaluate`` or ``flextrain predict``."""

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


class Backend(str, enum.Enum):
    LOCAL = "local"
    KUBERNETES = "kubernetes"


NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
NAN_POLICIES = ("fail", "skip-step")
# flextrain.master.stragglers.StragglerPolicy's values (flextrain.job may not import flextrain.master).
STRAGGLER_POLICIES = ("off", "report", "replace")
# flextrain.elastic.schedule.LRRule's values (flextrain.job may not import flextrain.elastic: same layer).
LR_RULES = ("none", "linear", "sqrt", "adascale")


# ---- one rule per kind of number ----------------------------------------------------------------
# Used by JobSpec.validate and by the CLI for flags that are not JobSpec fields. Messages name the
# flag; k8s.resource rewrites "--flag" into the ElasticJob field path, so one message serves both.
def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON/YAML `true` is no count


def check_count(flag: str, value) -> None:
    """How many of something (workers, epochs, samples, steps): an integer >= 1."""
    if not is_int(value) or value < 1:
        raise JobSpecError(f"{flag} must be a positive integer, got {value!r}")


def check_non_negative(flag: str, value) -> None:
    """A budget (retries, relaunches, servers) or a step interval where 0 means none / only at the end."""
    if not is_int(value) or value < 0:
        raise JobSpecError(f"{flag} must be an integer >= 0, got {value!r}")


def check_positive_finite(flag: str, value) -> None:
    """A timeout in seconds or a rate: 0 expires at once (every worker "hung" as it starts), inf never
    fires, and nan compares false with everything, so each would pass a plain ``> 0`` check or worse."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise JobSpecError(f"{flag} must be positive and finite, got {value!r}")


def check_port(flag: str, value) -> None:
    """A TCP port to listen on, 0 for a free one."""
    if not is_int(value) or not 0 <= value <= 65535:
        raise JobSpecError(f"{flag} must be a TCP port (0-65535; 0: a free port), got {value!r}")


def check_size_mb(flag: str, value) -> None:
    """A size in MiB where 0 means none (``--bucket-mb``): finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise JobSpecError(f"{flag} must be a number of MiB >= 0 (0: one flat reduction after backward), "
                           f"got {value!r}")


def check_seconds(flag: str, value) -> None:
    """An interval in seconds where 0 means none (``--memory-checkpoint-persist-seconds``): finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise JobSpecError(f"{flag} must be a number of seconds >= 0 (0: no time rule), got {value!r}")


def check_seed(flag: str, value) -> None:
    """What torch.manual_seed and the CRD take."""
    if not is_int(value) or not 0 <= value < 2**63:
        raise JobSpecError(f"{flag} must be an integer from 0 to 2**63-1, got {value!r}")


def check_nan_policy(flag: str, value) -> None:
    if value not in NAN_POLICIES:
        raise JobSpecError(f"{flag} must be one of {', '.join(NAN_POLICIES)}, got {value!r}")


def check_straggler_policy(flag: str, value) -> None:
    if value not in STRAGGLER_POLICIES:
        raise JobSpecError(f"{flag} must be one of {', '.join(STRAGGLER_POLICIES)}, got {value!r}")


def check_straggler_factor(flag: str, value) -> None:
    """How many times slower than the others' median counts as slow: a finite number above 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 < value < math.inf:
        raise JobSpecError(f"{flag} must be a number above 1 (times the other workers' median), got {value!r}")


def check_lr_rule(flag: str, value) -> None:
    if value not in LR_RULES:
        raise JobSpecError(f"{flag} must be one of {', '.join(LR_RULES)}, got {value!r}")


def check_batch_schedule(flag: str, value) -> None:
    """A path to a CSV trace or the trace's text inline (what it holds is read where it can be read:
    ``flextrain train`` and the master read a path, the operator checks inline text)."""
    if not isinstance(value, str) or not value.strip():
        raise JobSpecError(f"{flag} must be a path to a CSV trace 'step,batchsize' or the trace itself, got {value!r}")


def check_adaptive(*, batch_schedule, lr_rule, min_global_batch, max_global_batch, adapt_every) -> None:
    """``--batch-schedule adaptive`` needs its bounds (0 < min <= max: each checked positive on its own
    first); the bounds and ``--adapt-every`` mean nothing without it; its LR follows AdaScale's gain."""
    bounds = {"--min-global-batch": min_global_batch, "--max-global-batch": max_global_batch}
    if batch_schedule != "adaptive":
        given = [f for f, v in (*bounds.items(), ("--adapt-every", adapt_every)) if v is not None]
        if given:
            raise JobSpecError(f"{given[0]} applies to --batch-schedule adaptive only")
        return
    missing = [flag for flag, value in bounds.items() if value is None]
    if missing:
        raise JobSpecError(f"--batch-schedule adaptive needs {' and '.join(missing)} (the bounds of G)")
    if min_global_batch > max_global_batch:
        raise JobSpecError(f"--min-global-batch {min_global_batch} must be <= --max-global-batch {max_global_batch}")
    if lr_rule not in ("none", "adascale"):
        raise JobSpecError(f"--batch-schedule adaptive scales the LR by AdaScale's gain (--lr-rule adascale), "
                           f"got --lr-rule {lr_rule}")


AUTO = "auto"  # --max-micro-batch auto: each worker measures the largest micro-batch that fits


class IntOrStr:
    """The kind of a setting that holds an integer or a string (``--max-micro-batch 32`` or ``auto``,
    ``--memory-limit 2147483648`` or ``2GiB``); the CRD declares it ``x-kubernetes-int-or-string``."""


def check_max_micro_batch(flag: str, value) -> None:
    """A positive count, or ``"auto"`` (measured by each worker: docs/running-jobs.md)."""
    if value != AUTO and (not is_int(value) or value < 1):
        raise JobSpecError(f"{flag} must be a positive integer or 'auto', got {value!r}")


def check_memory_limit(flag: str, value) -> None:
    """Bytes (an integer >= 1) or a size with a unit ("2GiB", "512MB"): what the micro-batch probe of
    ``--max-micro-batch auto`` keeps a training step under. Only its form is checked here (flextrain.job
    may not import flextrain.elastic); the CLI and the operator parse it with
    ``flextrain.elastic.memory.parse_memory`` at submission, naming the flag."""
    if not (is_int(value) and value >= 1) and not (isinstance(value, str) and value.strip()):
        raise JobSpecError(f"{flag} must be a number of bytes or a size such as '2GiB', got {value!r}")


def check_auto_micro_batch(*, max_micro_batch, memory_limit, strategy, job_type, script) -> None:
    """``--max-micro-batch auto`` is for AllReduce training jobs of a module; ``--memory-limit`` is its
    bound and means nothing without it. (Whether the module is one the probe can step, PyTorch, is
    known once it is loaded: the CLI and the worker check that.)"""
    if max_micro_batch != AUTO:
        if memory_limit is not None:
            raise JobSpecError("--memory-limit applies to --max-micro-batch auto only (the bound its probe keeps "
                               "a training step under)")
        return
    if script:
        raise JobSpecError("--max-micro-batch auto applies to module jobs; a script plans its own micro-batches "
                           "with flextrain.elastic.torch.init(G, M)")
    if job_type is not JobType.TRAINING:
        raise JobSpecError(f"--max-micro-batch auto applies to training jobs (got a {job_type.value} job): "
                           "give the batch to run through the model as a number")
    if strategy is not Strategy.ALLREDUCE:
        raise JobSpecError("--max-micro-batch auto needs --distribution-strategy AllReduce: the probe measures a "
                           "worker's whole training step (forward, loss, backward, optimizer step), and a "
                           f"{strategy.value} worker's step applies no optimizer locally (the parameter servers "
                           "do); give --max-micro-batch as a number")


def check_accelerate(flag: str, value) -> None:
    """``auto``, a JSON strategy or a comma list of methods: only the form is checked here (flextrain.job may
    not import flextrain.accelerate); the CLI, the operator and the workers read it with
    ``flextrain.accelerate.jobs.check_setting``, naming the flag and the method."""
    if not isinstance(value, str) or not value.strip():
        raise JobSpecError(f"{flag} must be 'auto', a JSON strategy or a comma list of methods such as "
                           f"amp_native:bf16,checkpoint:Block, got {value!r}")


def check_accelerate_job(*, accelerate, strategy, job_type, script) -> None:
    """``--accelerate`` applies a strategy to an AllReduce training job's module (docs/accelerate.md, "In jobs").
    (Whether the module is a PyTorch one is known once it is loaded: the CLI and the workers check that.)"""
    if accelerate is None:
        return
    if script:
        raise JobSpecError("--accelerate applies to module jobs; a script calls auto_accelerate itself "
                           "(flextrain.accelerate or flextrain.compat.atorch)")
    if job_type is not JobType.TRAINING:
        raise JobSpecError(f"--accelerate applies to training jobs, not to {job_type.value} jobs")
    if strategy is not Strategy.ALLREDUCE:
        raise JobSpecError(f"--accelerate needs --distribution-strategy AllReduce: with {strategy.value} the "
                           "parameter servers hold the weights and apply the optimizer, and a strategy that casts "
                           "or replaces the worker's modules would train a different model from the one they keep")


GANGS = ("volcano", "kueue")  # spec.scheduling.gang: who admits the job's minimum set together (docs/shared-cluster.md)
_K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def check_gang(flag: str, value) -> None:
    if value not in GANGS:
        raise JobSpecError(f"{flag} must be one of {', '.join(GANGS)}, got {value!r}")


def check_object_name(flag: str, value) -> None:
    """The name of a Kubernetes object (a PriorityClass, a Kueue LocalQueue, a Volcano Queue): a DNS subdomain."""
    if not isinstance(value, str) or len(value) > 253 or not _K8S_NAME_RE.match(value):
        raise JobSpecError(f"{flag} must be a Kubernetes object name (lower-case letters, digits, '-' and '.'), "
                           f"got {value!r}")


def check_ps_mode(flag: str, value) -> None:
    if value not in ("sync", "async"):
        raise JobSpecError(f"{flag} must be 'sync' or 'async', got {value!r}")


def check_job_name(name) -> None:
    """A DNS label short enough that ``<name>-worker-<n>`` pod names stay valid."""
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > 53:
        raise JobSpecError(f"job name {name!r} must be a DNS label: lower-case letters, digits and '-', "
                           "at most 53 characters")


@dataclass(frozen=True)
class Setting:
    """One setting of a job, by every name it has."""

    key: str  # `flextrain train` dest; keyword of JobSpec.of / JobSpec.replace
    path: str  # in JobSpec: "training.global_batch_size"
    kind: type  # int, float, str, bool or an Enum
    crd: str | None = None  # in the ElasticJob ("spec.training.globalBatchSize"); None: not in the CRD (yet)
    flag: str | None = None  # None: "--" + key with dashes

    @property
    def option(self) -> str:
        """The command-line option that sets it."""
        return self.flag or "--" + self.key.replace("_", "-")


def _s(key: str, path: str, kind: type, crd: str | None = None, flag: str | None = None) -> Setting:
    return Setting(key, path, kind, crd, flag)


SETTINGS: tuple[Setting, ...] = (
    _s("name", "name", str, "metadata.name", "--job-name"),
    _s("model_def", "model_def", str, "spec.modelDef"),
    # A script job (flextrain run SCRIPT ARGS): the user's own training script instead of a module.
    _s("script", "script", str, "spec.script", "flextrain run SCRIPT"),
    _s("script_args", "script_args", list, "spec.scriptArgs", "flextrain run SCRIPT ARGS"),
    _s("job_dir", "job_dir", str, "spec.jobDir"),
    _s("strategy", "strategy", Strategy, "spec.strategy", "--distribution-strategy"),
    _s("backend", "backend", Backend),
    _s("job_type", "job_type", JobType, "spec.jobType", "the command (train, evaluate, predict)"),
    _s("checkpoint", "checkpoint", str, "spec.checkpoint"),  # evaluate/predict --checkpoint
    # The master's Prometheus endpoint (docs/observability.md).
    _s("metrics", "metrics", bool, "spec.metrics", "--no-metrics"),
    _s("metrics_port", "metrics_port", int, "spec.metricsPort"),
    # TLS and a per-job token on every channel (docs/security.md): off locally unless --tls, on for Kubernetes
    # jobs unless --no-tls / spec.tls: false (KUBERNETES_DEFAULTS).
    _s("tls", "tls", bool, "spec.tls", "--tls"),
    _s("output", "output", str, "spec.output"),  # predict --output
    _s("training_data", "data.training", str, "spec.data.training"),
    _s("validation_data", "data.validation", str, "spec.data.validation"),
    _s("prediction_data", "data.prediction", str, "spec.data.prediction"),
    _s("skip_unknown_files", "data.skip_unknown_files", bool, "spec.data.skipUnknownFiles"),
    _s("csv_header", "data.csv_header", bool, "spec.data.csvHeader"),
    # Decoded RecordIO chunks a worker keeps in memory for later epochs (docs/data.md#the-record-cache).
    _s("record_cache_mb", "data.record_cache_mb", int, "spec.data.recordCacheMb"),
    # The Kubernetes Secret whose keys become the environment of the master and the workers: a database
    # password (FLEXTRAIN_DATA_PASSWORD, or the driver's own such as PGPASSWORD), never in a data URL.
    _s("data_secret", "data.secret_ref", str, "spec.data.secretRef", "--data-secret"),
    _s("epochs", "training.epochs", int, "spec.training.epochs"),
    _s("global_batch_size", "training.global_batch_size", int, "spec.training.globalBatchSize"),
    # An integer, or "auto": each worker probes the largest micro-batch under memory_limit (docs/running-jobs.md).
    _s("max_micro_batch", "training.max_micro_batch", IntOrStr, "spec.training.maxMicroBatch"),
    _s("memory_limit", "training.memory_limit", IntOrStr, "spec.training.memoryLimit"),
    _s("learning_rate", "training.learning_rate", float, "spec.training.learningRate", "--lr"),
    # A training strategy (flextrain.accelerate): auto, a JSON strategy or a comma list (docs/accelerate.md).
    _s("accelerate", "training.accelerate", str, "spec.training.accelerate"),
    # A trace of the global batch per optimizer step: a CSV path, or its text inline (docs/batch-schedules.md).
    _s("batch_schedule", "training.batch_schedule", str, "spec.training.batchSchedule"),
    _s("lr_rule", "training.lr_rule", str, "spec.training.lrRule"),
    _s("reference_batch_size", "training.reference_batch_size", int, "spec.training.referenceBatchSize"),
    # --batch-schedule adaptive: the bounds of G and how often it is chosen (docs/batch-schedules.md)
    _s("min_global_batch", "training.min_global_batch", int, "spec.training.minGlobalBatch"),
    _s("max_global_batch", "training.max_global_batch", int, "spec.training.maxGlobalBatch"),
    _s("adapt_every", "training.adapt_every", int, "spec.training.adaptEvery"),
    _s("evaluation_steps", "training.evaluation_steps", int, "spec.training.evaluationSteps"),
    _s("checkpoint_steps", "training.checkpoint_steps", int, "spec.training.checkpointSteps"),
    # In-memory ("flash") checkpoints every N steps, persisted in the background (docs/elasticity.md).
    _s("memory_checkpoint_steps", "training.memory_checkpoint_steps", int, "spec.training.memoryCheckpointSteps"),
    # Every K-th in-memory checkpoint is also written to the job directory (docs/elasticity.md).
    _s("memory_checkpoint_persist_every", "training.memory_checkpoint_persist_every", int,
       "spec.training.memoryCheckpointPersistEvery"),
    _s("memory_checkpoint_persist_seconds", "training.memory_checkpoint_persist_seconds", float,
       "spec.training.memoryCheckpointPersistSeconds"),
    # Gradient buckets reduced during backward, in MiB (0: one reduction after backward; docs/elasticity.md).
    _s("bucket_mb", "training.bucket_mb", float, "spec.training.bucketMb"),
    _s("seed", "training.seed", int, "spec.training.seed"),
    _s("shuffle", "training.shuffle", bool, "spec.training.shuffle"),
    _s("steps_per_task", "training.steps_per_task", int, "spec.training.stepsPerTask"),
    _s("max_task_retries", "training.max_task_retries", int, "spec.training.maxTaskRetries"),
    _s("preflight", "training.preflight", bool, "spec.training.preflight", "--no-preflight"),
    # TensorBoard event files under <job-dir>/tensorboard/ (docs/observability.md).
    _s("tensorboard", "training.tensorboard", bool, "spec.training.tensorboard", "--no-tensorboard"),
    _s("nan_policy", "training.nan_policy", str, "spec.training.nanPolicy"),
    _s("workers", "worker.replicas", int, "spec.replicaSpecs.worker.replicas"),
    _s("min_workers", "worker.min_replicas", int, "spec.replicaSpecs.worker.minReplicas"),
    _s("max_workers", "worker.max_replicas", int, "spec.replicaSpecs.worker.maxReplicas"),
    _s("relaunch_budget", "worker.relaunch_budget", int, "spec.replicaSpecs.worker.relaunchBudget"),
    # A local worker's resident memory limit, enforced like a container's (flextrain/master/memwatch.py); on
    # Kubernetes the same idea is the pod's resources.limits.memory, so it has no ElasticJob field of its own.
    _s("worker_memory_limit", "worker.memory_limit", IntOrStr),
    # Spare workers started ahead and parked, taken by a scale-up or a replacement (docs/spares.md).
    _s("spares", "worker.spares", int, "spec.replicaSpecs.worker.spares", "--spare-workers"),
    # Workers persistently slower than the others, and a pre-flight check of each new worker (docs/shared-cluster.md).
    _s("straggler_policy", "worker.straggler_policy", str, "spec.replicaSpecs.worker.stragglerPolicy"),
    _s("straggler_factor", "worker.straggler_factor", float, "spec.replicaSpecs.worker.stragglerFactor"),
    _s("node_check", "worker.node_check", bool, "spec.replicaSpecs.worker.nodeCheck"),
    # Priority-based elasticity (docs/shared-cluster.md): the first min_replicas worker pods get the first
    # PriorityClass, the elastic rest the second (preempted first; a preempted worker costs no relaunch budget).
    _s("priority_class_name", "worker.priority_class_name", str, "spec.replicaSpecs.worker.priorityClassName"),
    _s("elastic_priority_class_name", "worker.elastic_priority_class_name", str,
       "spec.replicaSpecs.worker.elasticPriorityClassName"),
    _s("rendezvous_timeout", "worker.rendezvous_timeout", float, "spec.replicaSpecs.worker.rendezvousTimeout"),
    _s("worker_timeout", "worker.worker_timeout", float, "spec.replicaSpecs.worker.workerTimeout"),
    _s("start_timeout", "worker.start_timeout", float, "spec.replicaSpecs.worker.startTimeout"),
    _s("min_workers_timeout", "worker.min_workers_timeout", float, "spec.replicaSpecs.worker.minWorkersTimeout"),
    # Kubernetes only: gang admission (Volcano PodGroup or Kueue queue) and Kubernetes' Job lifecycle fields.
    _s("gang", "scheduling.gang", str, "spec.scheduling.gang"),
    _s("queue", "scheduling.queue", str, "spec.scheduling.queue"),
    _s("suspend", "suspend", bool, "spec.suspend"),
    _s("ttl_seconds_after_finished", "ttl_seconds_after_finished", int, "spec.ttlSecondsAfterFinished"),
    _s("active_deadline_seconds", "active_deadline_seconds", int, "spec.activeDeadlineSeconds"),
    _s("backoff_limit", "backoff_limit", int, "spec.backoffLimit"),
    _s("ps", "ps.replicas", int, "spec.replicaSpecs.ps.replicas"),
    _s("ps_mode", "ps.ps_mode", str, "spec.replicaSpecs.ps.psMode"),
    _s("grads_to_wait", "ps.grads_to_wait", int, "spec.replicaSpecs.ps.gradsToWait"),
    _s("ps_checkpoint_steps", "ps.ps_checkpoint_steps", int, "spec.replicaSpecs.ps.psCheckpointSteps"),
    _s("ps_wal", "ps.ps_wal", bool, "spec.replicaSpecs.ps.psWal"),
    _s("ps_wal_fsync", "ps.ps_wal_fsync", bool, "spec.replicaSpecs.ps.psWalFsync"),
)
SETTING = {s.key: s for s in SETTINGS}
SETTING_AT = {s.path: s for s in SETTINGS}
# Settings whose default differs for Kubernetes jobs: JobSpec's field default is the local one; this is what
# `flextrain train --backend kubernetes` uses unless told otherwise, what an ElasticJob without the field
# means, and the CRD's default.
KUBERNETES_DEFAULTS: dict[str, object] = {"tls": True}


def flag_of(key: str) -> str:
    """The ``flextrain train`` flag of a setting, by key or JobSpec path."""
    setting = SETTING.get(key) or SETTING_AT.get(key)
    return setting.option if setting else "--" + key.rsplit(".", 1)[-1].replace("_", "-")


# Every numeric JobSpec field, by kind. OPTIONAL_NUMBERS ones may be None (= derived from another field).
NUMBER_RULES = (
    (check_count, ("workers", "epochs", "global_batch_size", "steps_per_task", "reference_batch_size",
                   "memory_checkpoint_persist_every",
                   "min_workers", "max_workers", "grads_to_wait", "min_global_batch",
                   "max_global_batch", "adapt_every", "active_deadline_seconds")),
    (check_non_negative, ("evaluation_steps", "max_task_retries", "checkpoint_steps", "memory_checkpoint_steps",
                          "relaunch_budget", "spares", "ttl_seconds_after_finished", "backoff_limit",
                          "ps_checkpoint_steps", "record_cache_mb")),
    (check_positive_finite, ("rendezvous_timeout", "worker_timeout", "start_timeout", "min_workers_timeout",
                             "learning_rate")),
    (check_size_mb, ("bucket_mb",)),
    (check_seconds, ("memory_checkpoint_persist_seconds",)),
    (check_port, ("metrics_port",)),
)
OPTIONAL_NUMBERS = {"reference_batch_size", "min_workers", "max_workers", "grads_to_wait", "learning_rate",
                    "min_global_batch", "max_global_batch", "adapt_every", "ttl_seconds_after_finished",
                    "active_deadline_seconds", "backoff_limit", "record_cache_mb"}
# Every rule about one setting's value alone, by key: ``check(flag, value)`` raises JobSpecError. What
# the operator runs field by field, so that all bad values of an ElasticJob are reported at once.
VALUE_RULES = {
    **{key: check for check, keys in NUMBER_RULES for key in keys},
    "ps": check_non_negative, "seed": check_seed, "nan_policy": check_nan_policy,
    "straggler_policy": check_straggler_policy, "straggler_factor": check_straggler_factor, "ps_mode": check_ps_mode,
    "lr_rule": check_lr_rule, "batch_schedule": check_batch_schedule,
    "gang": check_gang, "queue": check_object_name, "priority_class_name": check_object_name,
    "elastic_priority_class_name": check_object_name,
    "max_micro_batch": check_max_micro_batch, "memory_limit": check_memory_limit, "accelerate": check_accelerate,
    "worker_memory_limit": check_memory_limit,
}
