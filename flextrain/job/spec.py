"""JobSpec and its sections, which mirror the ElasticJob's ``spec``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from flextrain.job.crossfield import CROSS_FIELD, check_script
from flextrain.job.settings import (
    SETTING_AT,
    NUMBER_RULES,
    OPTIONAL_NUMBERS,
    SETTING,
    SETTINGS,
    VALUE_RULES,
    Backend,
    JobSpecError,
    JobType,
    Strategy,
    check_job_name,
    check_batch_schedule,
    check_accelerate,
    check_lr_rule,
    check_max_micro_batch,
    check_memory_limit,
    check_nan_policy,
    check_seed,
    check_straggler_factor,
    check_straggler_policy,
    flag_of,
)

@dataclass(frozen=True)
class DataSpec:
    """``spec.data``: where the records come from and how files are read."""

    training: str | None = None  # required for training jobs
    validation: str | None = None
    prediction: str | None = None  # prediction jobs: records to predict on
    # Files under a data path that are not RecordIO, CSV or Parquet (or dangling links, unreadable files):
    # skipped with a warning naming each instead of failing the job (flextrain.data.sources).
    skip_unknown_files: bool = False
    # The first line of every CSV data file is a header, not a record.
    csv_header: bool = False
    # MiB of decoded RecordIO chunks a worker keeps for the next epoch's reads (flextrain/data/chunkcache.py);
    # None: 512, or a quarter of the worker's memory limit (container or worker.memory_limit) if less; 0: off.
    record_cache_mb: int | None = None
    # Kubernetes: the Secret holding a database password, mounted as environment into master and workers.
    secret_ref: str | None = None


@dataclass(frozen=True)
class TrainingSpec:
    """``spec.training``: what one optimizer step is and how the job steps through the data."""

    epochs: int = 1
    global_batch_size: int = 64
    # Largest micro-batch one worker holds; None means the whole global batch; "auto": each AllReduce
    # worker probes the largest whose training step stays under memory_limit, and a round plans with the
    # smallest of its members' (flextrain/worker/probing.py, flextrain/master/memory.py).
    max_micro_batch: int | str | None = None
    # "auto"'s bound: bytes, or a size such as "2GiB" (flextrain.elastic.memory.parse_memory); None: a
    # fraction of what each worker may use (flextrain.elastic.memory.default_memory_limit()).
    memory_limit: int | str | None = None
    learning_rate: float | None = None  # None: the module's own
    # A training strategy the workers apply to the module's model (flextrain.accelerate): "auto" (the first
    # worker searches, the master keeps its choice in <job dir>/accelerate/strategy.json), a JSON strategy
    # (flextrain train reads --accelerate FILE into it) or a comma list "amp_native:bf16,checkpoint:Block".
    accelerate: str | None = None
    # The global batch of every optimizer step from a trace (a CSV path, or its text inline: text with a
    # newline); global_batch_size then only defaults reference_batch_size and max_micro_batch.
    batch_schedule: str | None = None
    # How the LR follows G: none, linear (lr*G/ref), sqrt (lr*sqrt(G/ref)); adascale (lr*gain, measured).
    lr_rule: str = "none"
    reference_batch_size: int | None = None  # the G the base LR was tuned for; None: global_batch_size
    # batch_schedule "adaptive": G chosen by the master from the workers' gradient noise scale, within
    # [min_global_batch, max_global_batch], every adapt_every steps (None: each epoch).
    min_global_batch: int | None = None
    max_global_batch: int | None = None
    adapt_every: int | None = None
    # Evaluate on the validation data every this many optimizer steps (0: only at the end).
    evaluation_steps: int = 0
    # Save model + ledger every this many optimizer steps (0: only at the end).
    checkpoint_steps: int = 0
    # AllReduce: copy model + optimizer state to the job's shared memory every this many optimizer steps
    # (flash checkpoints: persisted in the background, flushed when the workers are lost; 0: off).
    # 0 (off) until its step-time cost is shown below 1% at 50 (bench/README.md, flash_checkpoint.py).
    memory_checkpoint_steps: int = 0
    # Of those in-memory snapshots, every this many-th is also written to the job directory (fsync'd) in the
    # background; the others live in shared memory only (a worker that exits, and the master when the workers
    # are lost, persist the newest). 1: every snapshot.
    memory_checkpoint_persist_every: int = 4
    # ... and only when at least this many seconds have passed since the last one written (0: by count alone).
    memory_checkpoint_persist_seconds: float = 30.0
    # AllReduce (PyTorch): gradients are summed in buckets of about this many MiB, launched from autograd hooks
    # while the last micro-step's backward runs (25: DDP's bucket_cap_mb); 0: one flat reduction after backward.
    bucket_mb: float = 25.0
    seed: int = 0
    shuffle: bool = False
    # Optimizer steps per task: the granularity of hand-out and re-queueing.
    steps_per_task: int = 8
    max_task_retries: int = 3
    # Before any worker starts, check the module's contract on the first records in a child
    # process (flextrain.worker.preflight); off for a module that needs the workers' hardware.
    preflight: bool = True
    # The master writes TensorBoard event files under <job-dir>/tensorboard/ from the job's history.
    tensorboard: bool = True
    # A non-finite loss or gradient: "fail" stops the job naming the step (nothing is applied);
    # "skip-step" drops that step (its records count as trained, nothing is applied) and goes on.
    nan_policy: str = "fail"

    @property
    def effective_max_micro_batch(self) -> int:
        """M as set (the global batch when unset); under ``auto`` the global batch, the probe's upper
        bound: a worker plans with the M its round gives it (``JoinRendezvousResponse.max_micro_batch``)."""
        return self.global_batch_size if self.auto_micro_batch else self.max_micro_batch or self.global_batch_size

    @property
    def auto_micro_batch(self) -> bool:
        """``--max-micro-batch auto``: each worker measures M (flextrain/worker/probing.py)."""
        return self.max_micro_batch == "auto"

    @property
    def auto_accelerate(self) -> bool:
        """``--accelerate auto``: the job's first worker searches for the strategy (docs/accelerate.md)."""
        return isinstance(self.accelerate, str) and self.accelerate.strip() == "auto"

    @property
    def effective_reference_batch_size(self) -> int:
        """The G the base LR is for: ``reference_batch_size``, else (adaptive) the min batch, else G."""
        return self.reference_batch_size or (self.min_global_batch if self.adaptive else self.global_batch_size)

    @property
    def adaptive(self) -> bool:
        """``--batch-schedule adaptive``: the master picks G from the gradient noise scale."""
        return self.batch_schedule == "adaptive"

    @property
    def effective_lr_rule(self) -> str:
        """The rule the workers apply: adaptive implies ``adascale`` (its noise measurement is the input)."""
        return "adascale" if self.adaptive else self.lr_rule

    @property
    def inline_schedule(self) -> bool:
        """Whether ``batch_schedule`` is the trace's text (it has a line break) rather than a path to it."""
        return self.batch_schedule is not None and "\n" in self.batch_schedule.strip()


@dataclass(frozen=True)
class WorkerSpec:
    """``spec.replicaSpecs.worker``: how many workers, and when one counts as lost."""

    replicas: int = 1
    min_replicas: int | None = None  # None: replicas
    max_replicas: int | None = None  # None: replicas
    # Times a crashed worker is relaunched before the job gives up on it.
    relaunch_budget: int = 3
    # Local backend: the resident memory a worker may use (bytes, or "2GiB"); one over it is killed as
    # OOMKilled and the job re-planned with a smaller micro-batch (flextrain/master/oom.py). None: no limit.
    memory_limit: int | str | None = None
    # Spare workers kept started ahead (module, model and optimizer built) and parked: a scale-up or the
    # replacement of a lost worker takes one instead of launching a worker (flextrain/master/spares.py).
    spares: int = 0
    # Workers whose compute per sample stays above straggler_factor x the others' median: "report" them
    # (status, log, Event), "replace" them (PS: shrink their tasks) or "off" (flextrain/master/stragglers.py).
    straggler_policy: str = "report"
    straggler_factor: float = 2.0
    # Time each new worker's training step before it registers; one straggler_factor x slower than the
    # others' is kept out of the job, naming its node.
    node_check: bool = False
    # Kubernetes: the PriorityClass of the first min_replicas worker pods (the guaranteed core) and of the
    # elastic rest (None: the core's); flextrain/master/k8s_priority.py.
    priority_class_name: str | None = None
    elastic_priority_class_name: str | None = None
    # Seconds a round waits for stragglers once `min_replicas` are present.
    rendezvous_timeout: float = 10.0
    # Seconds without a heartbeat after which a worker counts as hung.
    worker_timeout: float = 60.0
    # Seconds a started worker may take to be ready (import the module, build model and
    # optimizer) before it counts as hung; a pod not yet scheduled is not started.
    start_timeout: float = 300.0
    # Seconds a job waits with fewer than min_replicas alive before it fails.
    min_workers_timeout: float = 300.0

    @property
    def effective_min_replicas(self) -> int:
        return self.min_replicas if self.min_replicas is not None else self.replicas

    @property
    def effective_max_replicas(self) -> int:
        return self.max_replicas if self.max_replicas is not None else self.replicas


@dataclass(frozen=True)
class PSSpec:
    """``spec.replicaSpecs.ps``: the parameter servers of the ParameterServer strategy (unused by AllReduce)."""

    replicas: int = 0  # must be >= 1 with ParameterServer
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
    # With the log: each PS fdatasyncs every log write (one per group of pushes) before answering
    # them, so an acknowledged push survives the loss of the machine too, not only of the PS process.
    ps_wal_fsync: bool = False

    @property
    def effective_grads_to_wait(self) -> int:
        return self.grads_to_wait or 1


@dataclass(frozen=True)
class SchedulingSpec:
    """``spec.scheduling`` (Kubernetes only): gang admission of the job's minimum set (docs/shared-cluster.md)."""

    gang: str | None = None  # "volcano" (a PodGroup) or "kueue" (the queue label, created suspended)
    queue: str | None = None  # the Volcano Queue or Kueue LocalQueue


SECTIONS = {"data": DataSpec, "training": TrainingSpec, "worker": WorkerSpec, "ps": PSSpec,
            "scheduling": SchedulingSpec}


@dataclass(frozen=True)
class JobSpec:
    name: str
    model_def: str
    job_dir: str
    job_type: JobType = JobType.TRAINING
    strategy: Strategy = Strategy.ALLREDUCE
    backend: Backend = Backend.LOCAL
    # Evaluation/prediction jobs: the flextrain checkpoint file whose model they run.
    checkpoint: str | None = None
    # Prediction jobs: the directory predictions go to.
    output: str | None = None
    # Script jobs (``flextrain run``, ElasticJob ``spec.script``): the user's script and its arguments,
    # run by every worker under torchrun's environment; exclusive with ``model_def``.
    script: str | None = None
    script_args: tuple[str, ...] = ()
    # The master's Prometheus /metrics (flextrain/master/metrics.py): on unless turned off; port 0 picks a
    # free port locally, and the ElasticJob default (flextrain.k8s.meta.METRICS_PORT) on Kubernetes.
    metrics: bool = True
    metrics_port: int = 0
    # Every gRPC channel of the job over TLS with a per-job token (flextrain/protocol/security.py): a local
    # job's master makes the CA, certificate and token in <job dir>/tls/; a Kubernetes job's come from the
    # Secret <job>-tls the operator makes (docs/security.md). Off here, on for Kubernetes (KUBERNETES_DEFAULTS).
    tls: bool = False
    data: DataSpec = DataSpec()
    training: TrainingSpec = TrainingSpec()
    worker: WorkerSpec = WorkerSpec()
    ps: PSSpec = PSSpec()
    scheduling: SchedulingSpec = SchedulingSpec()
    # Kubernetes only, with Kubernetes' Job names and meanings (flextrain/operator/lifecycle.py): not started
    # while suspended; pods and Services deleted this long after the job finished; failed with reason
    # DeadlineExceeded this long after it started; master relaunches allowed (None: relaunchBudget's 3).
    suspend: bool = False
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    backoff_limit: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.script_args, list):  # from JSON or YAML: a tuple keeps the spec hashable and equal
            object.__setattr__(self, "script_args", tuple(self.script_args))

    @property
    def is_script(self) -> bool:
        """A script job: workers run the user's script (flextrain/worker/script_agent.py), no tasks."""
        return bool(self.script)

    # ---- construction and access by key ----------------------------------
    @classmethod
    def of(cls, *, name: str, model_def: str, job_dir: str, **settings) -> "JobSpec":
        """A JobSpec from settings by key (``workers=3, epochs=2``, see :data:`SETTINGS`); not validated."""
        return cls(name=name, model_def=model_def, job_dir=job_dir).replace(**settings)

    def replace(self, **changes) -> "JobSpec":
        """A copy with settings changed by key (``workers=5``) or whole sections (``training=...``)."""
        top: dict = {}
        nested: dict[str, dict] = {}
        for key, value in changes.items():
            if key in SECTIONS and isinstance(value, SECTIONS[key]):  # `ps=2` is a count, `ps=PSSpec(..)` a section
                top[key] = value
                continue
            setting = SETTING.get(key)
            if setting is None:
                raise JobSpecError(f"unknown JobSpec setting {key!r}")
            section, _, leaf = setting.path.rpartition(".")
            if section:
                nested.setdefault(section, {})[leaf] = value
            else:
                top[leaf] = value
        for section, leaves in nested.items():
            top[section] = dataclasses.replace(top.get(section, getattr(self, section)), **leaves)
        return dataclasses.replace(self, **top)

    def get(self, key: str):
        """A setting's value by key (``"workers"``) or JobSpec path (``"worker.replicas"``)."""
        value = self
        for part in (SETTING[key].path if key in SETTING else key).split("."):
            value = getattr(value, part)
        return value

    def settings(self) -> dict:
        """Every setting's value by key, in :data:`SETTINGS` order."""
        return {s.key: self.get(s.key) for s in SETTINGS}

    # ---- derived -----------------------------------------------------------
    @property
    def ps_checkpoint_dir(self) -> Path:
        return Path(self.job_dir) / "ps-checkpoints"

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.job_dir) / "checkpoints"

    # ---- validation --------------------------------------------------------
    def validate(self) -> "JobSpec":
        """Raise JobSpecError naming the first field that cannot work."""
        for section, kind in SECTIONS.items():
            if not isinstance(getattr(self, section), kind):  # a hand-built spec; of() and from_json build them
                raise JobSpecError(f"JobSpec.{section} must be a {kind.__name__}, got {getattr(self, section)!r}")
        check_job_name(self.name)
        check_script(self)
        for check, fields in NUMBER_RULES:
            for field in fields:
                value = self.get(field)
                if value is not None or field not in OPTIONAL_NUMBERS:
                    check(flag_of(field), value)
        check_seed("--seed", self.training.seed)
        check_nan_policy("--nan-policy", self.training.nan_policy)
        check_straggler_policy("--straggler-policy", self.worker.straggler_policy)
        check_straggler_factor("--straggler-factor", self.worker.straggler_factor)
        check_lr_rule("--lr-rule", self.training.lr_rule)
        if self.training.max_micro_batch is not None:
            check_max_micro_batch("--max-micro-batch", self.training.max_micro_batch)
        if self.training.memory_limit is not None:
            check_memory_limit("--memory-limit", self.training.memory_limit)
        if self.worker.memory_limit is not None:
            check_memory_limit("--worker-memory-limit", self.worker.memory_limit)
        if self.training.accelerate is not None:
            check_accelerate("--accelerate", self.training.accelerate)
        if self.training.batch_schedule is not None:
            check_batch_schedule("--batch-schedule", self.training.batch_schedule)
        for field in ("gang", "queue", "priority_class_name", "elastic_priority_class_name"):
            if self.get(field) is not None:
                VALUE_RULES[field](flag_of(field), self.get(field))
        for field in ("shuffle", "ps_wal", "ps_wal_fsync", "preflight", "tensorboard", "skip_unknown_files",
                      "csv_header", "suspend"):
            if not isinstance(self.get(field), bool):
                flag = f"--{field}" if field in ("preflight", "tensorboard") else flag_of(field)
                raise JobSpecError(f"{flag} must be true or false, got {self.get(field)!r}")
        for name, field, kind in (("--distribution-strategy", "strategy", Strategy), ("job type", "job_type", JobType),
                                  ("backend", "backend", Backend)):
            if not isinstance(getattr(self, field), kind):  # from_json converts; a hand-built spec may not
                raise JobSpecError(f"{name} must be one of {', '.join(k.value for k in kind)}, "
                                   f"got {self.get(field)!r}")
        for check in CROSS_FIELD[1:]:
            check(self)
        return self

    def cross_field_problems(self) -> list[str]:
        """Every problem between fields (flextrain/job/crossfield.py), not just the first.

        Assumes each field passed its own rule (:data:`VALUE_RULES`, as ``validate`` checks first);
        the operator uses it to report all problems of an ElasticJob at once.
        """
        out = []
        for check in CROSS_FIELD:
            try:
                check(self)
            except JobSpecError as exc:
                out.append(str(exc))
        return out

    # ---- (de)serialisation -------------------------------------------------
    def to_json(self) -> str:
        """Nested as the sections are; enums by value."""
        data = dataclasses.asdict(self)
        for key in ("strategy", "backend", "job_type"):
            data[key] = getattr(self, key).value
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        """Read :meth:`to_json`'s form, or the flat form job directories written before the sections
        existed (every setting at the top level by key), so such a job can still be resumed."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise JobSpecError(f"a JobSpec is a JSON object, got {type(data).__name__}")
        settings: dict = {}
        unknown = []
        for key, value in data.items():
            if key in SECTIONS and (isinstance(value, dict) or key not in SETTING):  # flat "ps": 2 is a count
                if not isinstance(value, dict):
                    raise JobSpecError(f"JobSpec section {key!r} must be an object, got {value!r}")
                for leaf, inner in value.items():
                    setting = SETTING_AT.get(f"{key}.{leaf}")
                    if setting is None:
                        unknown.append(f"{key}.{leaf}")
                    else:
                        settings[setting.key] = inner
            elif key in SETTING:  # a top-level field, or a flat (older) setting
                settings[key] = value
            else:
                unknown.append(key)
        if unknown:
            raise JobSpecError(f"unknown JobSpec fields: {', '.join(sorted(unknown))}")
        for key, kind in (("strategy", Strategy), ("backend", Backend), ("job_type", JobType)):
            if key in settings:
                settings[key] = kind(settings[key])
        try:
            return cls.of(**settings)
        except TypeError as exc:  # a required field missing
            raise JobSpecError(f"JobSpec: {exc}") from None
