"""ElasticJob <-> JobSpec: the CRD's camelCase spec and flextrain's one job description.

``jobspec_from_resource`` is what the operator validates on create and what
``flextrain master --job NAME`` runs; ``resource_from_jobspec`` is what
``flextrain train --backend kubernetes`` submits (and ``--dry-run`` prints).

Every error is a :class:`ResourceError` whose message starts with the CRD
field path (``spec.replicaSpecs.worker.minReplicas (5) > replicas (3)``), so
``kubectl describe ej/NAME`` tells the user exactly what to fix. JobSpec's own
checks speak in CLI flags; their messages are translated to field paths here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flextrain.job import Backend, JobSpec, JobSpecError, Strategy
from flextrain.k8s import meta

# Where a job's directory lives inside its pods when the spec names none. Mount
# a persistent volume there: a relaunched master resumes from the ledger and
# checkpoint it finds in the job directory.
DEFAULT_JOBS_ROOT = "/flextrain-jobs"
DEFAULT_MASTER_RELAUNCH_BUDGET = 3


class ResourceError(ValueError):
    """An ElasticJob that cannot run; the message starts with the offending field path."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if not problem.startswith(path) else problem)
        self.path = path


@dataclass(frozen=True)
class Field:
    """One CRD field that maps to one JobSpec field."""

    path: str  # dotted, below ``spec`` (e.g. "training.globalBatchSize")
    jobspec: str  # JobSpec field name
    kind: type  # int, float, str or bool
    flags: tuple[str, ...] = ()  # the CLI flags JobSpec's messages use for it, beyond the derived one

    @property
    def full_path(self) -> str:
        return f"spec.{self.path}"


# The mapping, in the order ``resource_from_jobspec`` writes it. A JobSpec field
# that another component has not added yet is skipped (see ``active_fields``).
FIELDS: tuple[Field, ...] = (
    Field("modelDef", "model_def", str),
    Field("strategy", "strategy", str, ("--distribution-strategy",)),
    Field("jobDir", "job_dir", str),
    Field("data.training", "training_data", str),
    Field("data.validation", "validation_data", str),
    Field("data.prediction", "prediction_data", str),
    Field("data.skipUnknownFiles", "skip_unknown_files", bool),
    Field("data.csvHeader", "csv_header", bool),
    Field("training.epochs", "epochs", int),
    Field("training.globalBatchSize", "global_batch_size", int),
    Field("training.maxMicroBatch", "max_micro_batch", int),
    Field("training.learningRate", "learning_rate", float, ("--lr",)),
    Field("training.lrRule", "lr_rule", str),
    Field("training.batchSchedule", "batch_schedule", str),
    Field("training.evaluationSteps", "evaluation_steps", int),
    Field("training.checkpointSteps", "checkpoint_steps", int),
    Field("training.seed", "seed", int),
    Field("training.shuffle", "shuffle", bool),
    Field("training.stepsPerTask", "steps_per_task", int),
    Field("training.maxTaskRetries", "max_task_retries", int),
    Field("training.preflight", "preflight", bool),
    Field("training.nanPolicy", "nan_policy", str),
    Field("replicaSpecs.worker.replicas", "workers", int),
    Field("replicaSpecs.worker.minReplicas", "min_workers", int),
    Field("replicaSpecs.worker.maxReplicas", "max_workers", int),
    Field("replicaSpecs.worker.relaunchBudget", "relaunch_budget", int),
    Field("replicaSpecs.worker.rendezvousTimeout", "rendezvous_timeout", float),
    Field("replicaSpecs.worker.workerTimeout", "worker_timeout", float),
    Field("replicaSpecs.worker.startTimeout", "start_timeout", float),
    Field("replicaSpecs.worker.minWorkersTimeout", "min_workers_timeout", float),
    Field("replicaSpecs.ps.replicas", "ps", int),
    Field("replicaSpecs.ps.psMode", "ps_mode", str),
    Field("replicaSpecs.ps.gradsToWait", "grads_to_wait", int),
    Field("replicaSpecs.ps.psCheckpointSteps", "ps_checkpoint_steps", int),
    Field("replicaSpecs.ps.psWal", "ps_wal", bool),
)

# Fields of the spec that describe pods rather than the job: known, not JobSpec.
_POD_FIELDS = {"resources", "priorityClassName", "env"}
POD_LEVEL = {
    "image", "volumes", "imagePullPolicy", "replicaSpecs.master.relaunchBudget", "training.checkpointDir",
    *(f"replicaSpecs.{role}.{f}" for role in ("master", "worker", "ps") for f in _POD_FIELDS),
}
REQUIRED = ("image", "modelDef", "data.training")


def _jobspec_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(JobSpec)}


def active_fields() -> tuple[Field, ...]:
    have = _jobspec_fields()
    return tuple(f for f in FIELDS if f.jobspec in have)


def _get(obj: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _set(obj: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value


def _check_type(field_path: str, value: Any, kind: type) -> Any:
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        bool: isinstance(value, bool),
        str: isinstance(value, str),
    }[kind]
    if not ok:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        raise ResourceError(field_path, f"must be {names[kind]}, got {value!r}")
    return float(value) if kind is float else value


def _check_unknown(spec: Mapping[str, Any], known: set[str]) -> None:
    """Reject keys no field uses (a typo would otherwise be silently ignored)."""
    prefixes = {k.rsplit(".", i)[0] for k in known for i in range(k.count(".") + 1)}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in known:
                continue
            if path not in prefixes:
                raise ResourceError(f"spec.{path}", "unknown field")
            if not isinstance(value, Mapping):
                raise ResourceError(f"spec.{path}", f"must be an object, got {value!r}")
            walk(value, f"{path}.")

    walk(spec, "")


def _flag_map(fields: tuple[Field, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in fields:
        out["--" + f.jobspec.replace("_", "-")] = f.full_path
        for flag in f.flags:
            out[flag] = f.full_path
    return out


def _translate(message: str, fields: tuple[Field, ...]) -> str:
    """Rewrite JobSpec's ``--flag`` names into CRD field paths."""
    flags = _flag_map(fields)
    message = re.sub(r"--[a-z][a-z-]*", lambda m: flags.get(m.group(0), m.group(0)), message)
    return message.replace("job name", "metadata.name", 1)


def jobspec_from_resource(obj: Mapping[str, Any]) -> JobSpec:
    """Build and validate the JobSpec of an ElasticJob object (a dict as the API returns it).

    Raises ResourceError naming the CRD field path of the first problem.
    """
    if obj.get("apiVersion", meta.API_VERSION) != meta.API_VERSION or obj.get("kind", meta.KIND) != meta.KIND:
        raise ResourceError("apiVersion", f"expected {meta.API_VERSION} {meta.KIND}, got "
                                          f"{obj.get('apiVersion')} {obj.get('kind')}")
    name = _get(obj, "metadata.name")
    if not isinstance(name, str) or not name:
        raise ResourceError("metadata.name", "is required")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ResourceError("spec", "is required")
    fields = active_fields()
    _check_unknown(spec, {f.path for f in FIELDS} | POD_LEVEL)
    for path in REQUIRED:
        value = _get(spec, path)
        if value is None or value == "":
            raise ResourceError(f"spec.{path}", "is required")
    _check_type("spec.image", spec["image"], str)
    budget = _get(spec, "replicaSpecs.master.relaunchBudget")
    if budget is not None and (_check_type("spec.replicaSpecs.master.relaunchBudget", budget, int) < 0):
        raise ResourceError("spec.replicaSpecs.master.relaunchBudget", f"must be >= 0, got {budget}")
    _check_volumes(spec.get("volumes"))

    for f in FIELDS:  # in the CRD, with no behaviour yet: refused, never silently dropped
        if f not in fields and _get(spec, f.path) is not None:
            raise ResourceError(f.full_path, "is not supported yet: flextrain does not act on it, so the job would "
                                             "run as if it were not there; remove it")
    values: dict[str, Any] = {}
    for f in fields:
        value = _get(spec, f.path)
        if value is not None:
            values[f.jobspec] = _check_type(f.full_path, value, f.kind)
    _check_replicas(values)
    strategy = values.pop("strategy", Strategy.ALLREDUCE.value)
    try:
        values["strategy"] = Strategy(strategy)
    except ValueError:
        allowed = " | ".join(s.value for s in Strategy)
        raise ResourceError("spec.strategy", f"must be {allowed}, got {strategy!r}") from None
    values.setdefault("job_dir", f"{DEFAULT_JOBS_ROOT}/{name}")
    checkpoint_dir = _get(spec, "training.checkpointDir")
    if checkpoint_dir is not None and _check_type("spec.training.checkpointDir", checkpoint_dir, str).rstrip("/") != f"{values['job_dir'].rstrip('/')}/checkpoints":
        # The ledger snapshot and the model checkpoint must stay together for an exact resume.
        raise ResourceError("spec.training.checkpointDir",
                            f"{checkpoint_dir!r} is not supported yet: checkpoints go to <jobDir>/checkpoints "
                            f"({values['job_dir']}/checkpoints); set spec.jobDir instead")
    try:
        return JobSpec(name=name, backend=Backend.KUBERNETES, **values).validate()
    except JobSpecError as exc:
        message = _translate(str(exc), fields)
        path = message.split(" ", 1)[0] if message.startswith(("spec.", "metadata.")) else "spec"
        raise ResourceError(path, message) from None


def _check_replicas(values: Mapping[str, Any]) -> None:
    """``minReplicas <= replicas <= maxReplicas``, stated in the CRD's words."""
    base = "spec.replicaSpecs.worker"
    replicas = values.get("workers", 1)
    for key, label in (("workers", "replicas"), ("min_workers", "minReplicas"), ("max_workers", "maxReplicas")):
        if key in values and values[key] < 1:
            raise ResourceError(f"{base}.{label}", f"must be >= 1, got {values[key]}")
    lo, hi = values.get("min_workers"), values.get("max_workers")
    if lo is not None and lo > replicas:
        raise ResourceError(f"{base}.minReplicas", f"{base}.minReplicas ({lo}) > replicas ({replicas})")
    if hi is not None and hi < replicas:
        raise ResourceError(f"{base}.maxReplicas", f"{base}.maxReplicas ({hi}) < replicas ({replicas})")


def replica_range(spec: JobSpec) -> tuple[int, int]:
    """The worker counts a running job may be scaled to."""
    return spec.effective_min_workers, spec.effective_max_workers


def master_relaunch_budget(obj: Mapping[str, Any]) -> int:
    """Times the operator relaunches a master pod that failed or vanished before the job ended."""
    value = _get(obj, "spec.replicaSpecs.master.relaunchBudget")
    return DEFAULT_MASTER_RELAUNCH_BUDGET if value is None else int(value)


def _check_volumes(volumes: Any) -> None:
    if volumes is None:
        return
    if not isinstance(volumes, list):
        raise ResourceError("spec.volumes", f"must be a list, got {volumes!r}")
    for i, volume in enumerate(volumes):
        where = f"spec.volumes[{i}]"
        if not isinstance(volume, Mapping):
            raise ResourceError(where, f"must be an object, got {volume!r}")
        for key in ("name", "mountPath"):
            if not isinstance(volume.get(key), str) or not volume[key]:
                raise ResourceError(f"{where}.{key}", "is required")
        if not volume["mountPath"].startswith("/"):
            raise ResourceError(f"{where}.mountPath", f"must be an absolute path, got {volume['mountPath']!r}")


@dataclass(frozen=True)
class PodSettings:
    """What an ElasticJob says about the pods of one role (master, worker or ps)."""

    image: str
    image_pull_policy: str | None
    resources: Mapping[str, Any] | None
    priority_class_name: str | None
    env: tuple[Mapping[str, Any], ...]
    volumes: tuple[dict[str, Any], ...]  # core/v1 Volumes of the pod
    volume_mounts: tuple[dict[str, Any], ...]  # the container's mounts of them


_MOUNT_KEYS = ("mountPath", "readOnly", "subPath")


def pod_settings(obj: Mapping[str, Any], role: str) -> PodSettings:
    """The pod-level fields of ``obj`` for ``role``; ``spec.volumes`` split into volumes and mounts.

    An ElasticJob volume is a core/v1 Volume plus ``mountPath``/``readOnly``/``subPath``;
    every pod of the job mounts every volume.
    """
    spec = obj.get("spec") or {}
    replica = _get(spec, f"replicaSpecs.{role}") or {}
    volumes, mounts = [], []
    for volume in spec.get("volumes") or ():
        volumes.append({k: v for k, v in volume.items() if k not in _MOUNT_KEYS})
        mounts.append({"name": volume["name"], **{k: volume[k] for k in _MOUNT_KEYS if k in volume}})
    return PodSettings(
        image=spec.get("image", ""), image_pull_policy=spec.get("imagePullPolicy"),
        resources=replica.get("resources"), priority_class_name=replica.get("priorityClassName"),
        env=tuple(replica.get("env") or ()), volumes=tuple(volumes), volume_mounts=tuple(mounts),
    )


def resource_from_jobspec(
    spec: JobSpec,
    *,
    image: str,
    namespace: str | None = None,
    pod_fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ElasticJob that runs ``spec`` (round-trips through ``jobspec_from_resource``).

    Fields equal to JobSpec's defaults are left out so the printed YAML shows
    what was chosen. ``pod_fields`` are extra spec entries (``volumes``,
    ``replicaSpecs.worker.resources``, ...) given by dotted path.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(JobSpec)
                if f.default is not dataclasses.MISSING}
    mapped = {f.jobspec for f in FIELDS} | {"name", "backend"}
    for field, default in sorted(defaults.items()):
        # A setting the ElasticJob cannot carry yet must not vanish on the way to the cluster.
        if field not in mapped and getattr(spec, field) != default:
            raise ResourceError(f"JobSpec.{field}", f"{getattr(spec, field)!r} has no ElasticJob field yet "
                                                    "(run this job with the local backend)")
    body: dict[str, Any] = {"image": image}
    for f in active_fields():
        value = getattr(spec, f.jobspec)
        if f.jobspec == "job_dir" and value == f"{DEFAULT_JOBS_ROOT}/{spec.name}":
            continue
        if value is None or (f.jobspec in defaults and value == defaults[f.jobspec]
                             and f.jobspec not in ("workers", "epochs", "global_batch_size", "strategy")):
            continue
        _set(body, f.path, value.value if isinstance(value, Strategy) else value)
    for path, value in (pod_fields or {}).items():
        if path not in POD_LEVEL:
            raise ResourceError(f"spec.{path}", "is not a pod-level field")
        _set(body, path, value)
    metadata: dict[str, Any] = {"name": spec.name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": metadata, "spec": body}


__all__ = [
    "DEFAULT_JOBS_ROOT",
    "DEFAULT_MASTER_RELAUNCH_BUDGET",
    "FIELDS",
    "PodSettings",
    "ResourceError",
    "jobspec_from_resource",
    "master_relaunch_budget",
    "pod_settings",
    "replica_range",
    "resource_from_jobspec",
]
