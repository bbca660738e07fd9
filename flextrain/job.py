"""JobSpec: the one typed description of a job.

It is built from ``flextrain train`` flags or (on Kubernetes) from an
ElasticJob spec, travels to workers as JSON over gRPC, and is what the master,
the workers and the status file agree on. Field names are the snake_case form
of the CLI flags (``--global-batch-size`` -> ``global_batch_size``) and of the
CRD's camelCase fields (``globalBatchSize``): one name per idea.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path


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


_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# ---- one rule per kind of number ----------------------------------------------------------------
# Used by JobSpec.validate and by the CLI for flags that are not JobSpec fields. Messages name the
# flag; k8s.resource rewrites "--flag" into the ElasticJob field path, so one message serves both.
def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON/YAML `true` is no count


def check_count(flag: str, value) -> None:
    """How many of something (workers, epochs, samples, steps): an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise JobSpecError(f"{flag} must be a positive integer, got {value!r}")


def check_non_negative(flag: str, value) -> None:
    """A budget (retries, relaunches, servers) or a step interval where 0 means none / only at the end."""
    if not _is_int(value) or value < 0:
        raise JobSpecError(f"{flag} must be an integer >= 0, got {value!r}")


def check_positive_finite(flag: str, value) -> None:
    """A timeout in seconds or a rate: 0 expires at once (every worker "hung" as it starts), inf never
    fires, and nan compares false with everything, so each would pass a plain ``> 0`` check or worse."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise JobSpecError(f"{flag} must be positive and finite, got {value!r}")


def flag_of(field: str) -> str:
    """The ``flextrain train`` flag of a JobSpec field."""
    return {"learning_rate": "--lr", "strategy": "--distribution-strategy", "name": "--job-name",
            "preflight": "--no-preflight"}.get(field, "--" + field.replace("_", "-"))


# Every numeric JobSpec field, by kind. _OPTIONAL ones may be None (= derived from another field).
_NUMBER_RULES = (
    (check_count, ("workers", "epochs", "global_batch_size", "steps_per_task",
                   "max_micro_batch", "min_workers", "max_workers", "grads_to_wait")),
    (check_non_negative, ("evaluation_steps", "max_task_retries", "checkpoint_steps", "relaunch_budget",
                          "ps_checkpoint_steps")),
    (check_positive_finite, ("rendezvous_timeout", "worker_timeout", "start_timeout", "min_workers_timeout",
                             "learning_rate")),
)
NAN_POLICIES = ("fail", "skip-step")
_OPTIONAL = {"max_micro_batch", "min_workers", "max_workers", "grads_to_wait", "learning_rate"}


@dataclass(frozen=True)
class JobSpec:
    name: str
    model_def: str
    # Required for training jobs; evaluation/prediction jobs read no training data.
    training_data: str | None
    job_dir: str
    validation_data: str | None = None
    job_type: JobType = JobType.TRAINING
    # Evaluate on validation_data every this many optimizer steps (0: only at the end).
    evaluation_steps: int = 0
    # Evaluation/prediction jobs: the flextrain checkpoint file whose model they run.
    checkpoint: str | None = None
    # Prediction jobs: records to predict on, and the directory predictions go to.
    prediction_data: str | None = None
    output: str | None = None
    strategy: Strategy = Strategy.ALLREDUCE
    backend: Backend = Backend.LOCAL
    workers: int = 1
    min_workers: int | None = None
    max_workers: int | None = None
    epochs: int = 1
    global_batch_size: int = 64
    # Largest micro-batch one worker holds; None means the whole global batch.
    max_micro_batch: int | None = None
    learning_rate: float | None = None
    seed: int = 0
    shuffle: bool = False
    # Files under a data path that are not RecordIO or CSV (or dangling links, unreadable files):
    # skipped with a warning naming each instead of failing the job (flextrain.data.sources).
    skip_unknown_files: bool = False
    # The first line of every CSV data file is a header, not a record.
    csv_header: bool = False
    # Optimizer steps per task: the granularity of hand-out and re-queueing.
    steps_per_task: int = 8
    max_task_retries: int = 3
    # Save model + ledger every this many optimizer steps (0: only at the end).
    checkpoint_steps: int = 0
    # Seconds a round waits for stragglers once `min_workers` are present.
    rendezvous_timeout: float = 10.0
    # Seconds without a heartbeat after which a worker counts as hung.
    worker_timeout: float = 60.0
    # Seconds a started worker may take to be ready (import the module, build model and
    # optimizer) before it counts as hung; a pod not yet scheduled is not started.
    start_timeout: float = 300.0
    # Seconds a job waits with fewer than min_workers alive before it fails.
    min_workers_timeout: float = 300.0
    # Times a crashed worker is relaunched before the job gives up on it.
    relaunch_budget: int = 3
    # Before any worker starts, check the module's contract on the first records in a child
    # process (flextrain.worker.preflight); off for a module that needs the workers' hardware.
    preflight: bool = True
    # A non-finite loss or gradient: "fail" stops the job naming the step (nothing is applied);
    # "skip-step" drops that step (its records count as trained, nothing is applied) and goes on.
    nan_policy: str = "fail"
    # ---- ParameterServer strategy (ignored by AllReduce) ----------------------
    # Number of parameter-server processes; must be >= 1 with ParameterServer.
    ps: int = 0
    # "sync": a PS applies one update per `grads_to_wait` pushes and rejects stale
    # ones (the worker recomputes them); "async": every push is applied at once.
    ps_mode: str = "sync"
    # Pushes a sync PS averages into one update. None means 1: with more, the
    # last minibatches of a job can wait for pushes that never come.
    grads_to_wait: int | None = None
    # A PS checkpoints every this many of its versions (0: only when it stops).
    ps_checkpoint_steps: int = 20
    # Each PS appends every change it acknowledges to a write-ahead log before
    # applying it, so a relaunched PS comes back exactly where it was. Off: a
    # relaunched PS loses the updates since its last checkpoint (faster pushes).
    ps_wal: bool = True

    # ---- derived -----------------------------------------------------------
    @property
    def effective_min_workers(self) -> int:
        return self.min_workers if self.min_workers is not None else self.workers

    @property
    def effective_max_workers(self) -> int:
        return self.max_workers if self.max_workers is not None else self.workers

    @property
    def effective_max_micro_batch(self) -> int:
        return self.max_micro_batch or self.global_batch_size

    @property
    def effective_grads_to_wait(self) -> int:
        return self.grads_to_wait or 1

    @property
    def ps_checkpoint_dir(self) -> Path:
        return Path(self.job_dir) / "ps-checkpoints"

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.job_dir) / "checkpoints"

    # ---- validation --------------------------------------------------------
    def validate(self) -> "JobSpec":
        """Raise JobSpecError naming the first field that cannot work."""
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name) or len(self.name) > 53:
            raise JobSpecError(
                f"job name {self.name!r} must be a DNS label: lower-case letters, digits and '-', "
                "at most 53 characters"
            )
        if not self.model_def:
            raise JobSpecError("--model-def is required (e.g. model_zoo/digits_torch.py:Model)")
        for check, fields in _NUMBER_RULES:
            for field in fields:
                value = getattr(self, field)
                if value is not None or field not in _OPTIONAL:
                    check(flag_of(field), value)
        if not _is_int(self.seed) or not 0 <= self.seed < 2**63:  # what torch.manual_seed and the CRD take
            raise JobSpecError(f"--seed must be an integer from 0 to 2**63-1, got {self.seed!r}")
        if self.nan_policy not in NAN_POLICIES:
            raise JobSpecError(f"--nan-policy must be one of {', '.join(NAN_POLICIES)}, got {self.nan_policy!r}")
        for field in ("shuffle", "ps_wal", "preflight", "skip_unknown_files", "csv_header"):
            if not isinstance(getattr(self, field), bool):
                raise JobSpecError(f"{'--preflight' if field == 'preflight' else flag_of(field)} must be true or false, got {getattr(self, field)!r}")
        for name, field, kind in (("--distribution-strategy", "strategy", Strategy), ("job type", "job_type", JobType),
                                  ("backend", "backend", Backend)):
            if not isinstance(getattr(self, field), kind):  # from_json converts; a hand-built spec may not
                raise JobSpecError(f"{name} must be one of {', '.join(k.value for k in kind)}, "
                                   f"got {getattr(self, field)!r}")
        self._validate_worker_range()
        self._validate_job_type()
        self._validate_ps()
        return self

    def _validate_worker_range(self) -> None:
        """min_workers <= workers <= max_workers, blaming only flags that were given.

        An unset bound defaults to --workers, so it can never be the culprit:
        ``--workers 3 --max-workers 2`` is about --workers and --max-workers.
        """
        lo, n, hi = self.min_workers, self.workers, self.max_workers
        if lo is not None and hi is not None:
            if lo > hi:
                raise JobSpecError(f"--min-workers ({lo}) is greater than --max-workers ({hi})")
            if not lo <= n <= hi:
                raise JobSpecError(f"--workers ({n}) must lie between --min-workers ({lo}) and --max-workers ({hi})")
        elif lo is not None and lo > n:
            raise JobSpecError(f"--min-workers ({lo}) is greater than --workers ({n})")
        elif hi is not None and n > hi:
            raise JobSpecError(f"--workers ({n}) is greater than --max-workers ({hi})")

    def _validate_job_type(self) -> None:
        if self.job_type is JobType.TRAINING:
            if not self.training_data:
                raise JobSpecError("--training-data is required")
        else:
            if self.strategy is not Strategy.ALLREDUCE:
                raise JobSpecError(f"{self.job_type.value} jobs run without --distribution-strategy "
                                   f"(got {self.strategy.value})")
            if not self.checkpoint:
                raise JobSpecError(f"--checkpoint is required for an {self.job_type.value} job "
                                   "(a checkpoint file or a training job's directory)")
        if self.job_type is JobType.EVALUATION and not self.validation_data:
            raise JobSpecError("--validation-data is required for an evaluation job")
        if self.job_type is JobType.PREDICTION:
            if not self.prediction_data:
                raise JobSpecError("--prediction-data is required for a prediction job")
            if not self.output:
                raise JobSpecError("--output is required for a prediction job (directory for the predictions)")
        if self.evaluation_steps and not self.validation_data:
            raise JobSpecError(f"--evaluation-steps {self.evaluation_steps} needs --validation-data")
        if self.evaluation_steps and self.job_type is not JobType.TRAINING:
            raise JobSpecError("--evaluation-steps applies to training jobs only")

    def _validate_ps(self) -> None:
        if self.strategy is Strategy.PARAMETER_SERVER:
            if not _is_int(self.ps) or self.ps < 1:
                raise JobSpecError(
                    f"--distribution-strategy ParameterServer needs --ps N (N >= 1 parameter servers), "
                    f"got {self.ps!r}")
        else:
            check_non_negative("--ps", self.ps)
            if self.ps:
                raise JobSpecError(f"--ps {self.ps} needs --distribution-strategy ParameterServer "
                                   f"(the strategy is {self.strategy.value})")
        if self.ps_mode not in ("sync", "async"):
            raise JobSpecError(f"--ps-mode must be 'sync' or 'async', got {self.ps_mode!r}")

    # ---- (de)serialisation -------------------------------------------------
    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["strategy"] = self.strategy.value
        data["backend"] = self.backend.value
        data["job_type"] = self.job_type.value
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobSpecError(f"unknown JobSpec fields: {', '.join(unknown)}")
        data["strategy"] = Strategy(data.get("strategy", Strategy.ALLREDUCE.value))
        data["backend"] = Backend(data.get("backend", Backend.LOCAL.value))
        data["job_type"] = JobType(data.get("job_type", JobType.TRAINING.value))
        return cls(**data)

    def replace(self, **changes) -> "JobSpec":
        return dataclasses.replace(self, **changes)
