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

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flextrain.job import SETTING, SETTINGS, Backend, JobSpec, JobSpecError, Strategy
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
    """One CRD field that maps to one JobSpec setting (a row of ``flextrain.job.SETTINGS``)."""

    path: str  # dotted, below ``spec`` (e.g. "training.globalBatchSize")
    key: str  # the setting's key (flextrain.job.SETTING)
    kind: type  # int, float, str or bool

    @property
    def full_path(self) -> str:
        return f"spec.{self.path}"


# The mapping, in the order ``resource_from_jobspec`` writes it: the settings table's CRD column.
FIELDS: tuple[Field, ...] = tuple(
    Field(s.crd.removeprefix("spec."), s.key, s.kind if s.kind in (int, float, str, bool) else str)
    for s in SETTINGS if s.crd and s.crd.startswith("spec."))
# In the CRD with no behaviour yet: refused (never silently dropped) until an issue implements them.
NOT_YET = ("training.lrRule", "training.batchSchedule")

# Fields of the spec that describe pods rather than the job: known, not JobSpec.
_POD_FIELDS = {"resources", "priorityClassName", "env", "template"}
POD_LEVEL = {
    "image", "volumes", "imagePullPolicy", "replicaSpecs.master.relaunchBudget", "training.checkpointDir",
    *(f"replicaSpecs.{role}.{f}" for role in ("master", "worker", "ps") for f in _POD_FIELDS),
}
REQUIRED = ("image", "modelDef", "data.training")


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


def _flag_map() -> dict[str, str]:
    out: dict[str, str] = {}
    for f in FIELDS:
        out["--" + f.key.replace("_", "-")] = out[SETTING[f.key].option] = f.full_path
    return out


def _translate(message: str) -> str:
    """Rewrite JobSpec's ``--flag`` names into CRD field paths."""
    flags = _flag_map()
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
    _check_unknown(spec, {f.path for f in FIELDS} | set(NOT_YET) | POD_LEVEL)
    for path in REQUIRED:
        value = _get(spec, path)
        if value is None or value == "":
            raise ResourceError(f"spec.{path}", "is required")
    _check_type("spec.image", spec["image"], str)
    budget = _get(spec, "replicaSpecs.master.relaunchBudget")
    if budget is not None and (_check_type("spec.replicaSpecs.master.relaunchBudget", budget, int) < 0):
        raise ResourceError("spec.replicaSpecs.master.relaunchBudget", f"must be >= 0, got {budget}")
    _check_volumes(spec.get("volumes"))

    for path in NOT_YET:
        if _get(spec, path) is not None:
            raise ResourceError(f"spec.{path}", "is not supported yet: flextrain does not act on it, so the job would "
                                             "run as if it were not there; remove it")
    values: dict[str, Any] = {}
    for f in FIELDS:
        value = _get(spec, f.path)
        if value is not None:
            values[f.key] = _check_type(f.full_path, value, f.kind)
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
        return JobSpec.of(name=name, backend=Backend.KUBERNETES, **values).validate()
    except JobSpecError as exc:
        message = _translate(str(exc))
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
    return spec.worker.effective_min_replicas, spec.worker.effective_max_replicas


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
    defaults = JobSpec.of(name=spec.name, model_def="", job_dir="").settings()
    mapped = {f.key for f in FIELDS} | {"name", "backend"}
    for key, value in spec.settings().items():
        # A setting the ElasticJob cannot carry yet must not vanish on the way to the cluster.
        if key not in mapped and value != defaults[key]:
            raise ResourceError(f"JobSpec.{SETTING[key].path}", f"{value!r} has no ElasticJob field yet "
                                                               "(run this job with the local backend)")
    body: dict[str, Any] = {"image": image}
    for f in FIELDS:
        value = spec.get(f.key)
        if f.key == "job_dir" and value == f"{DEFAULT_JOBS_ROOT}/{spec.name}":
            continue
        if value is None or (value == defaults[f.key]
                             and f.key not in ("workers", "epochs", "global_batch_size", "strategy", "model_def")):
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
    "NOT_YET",
    "PodSettings",
    "ResourceError",
    "jobspec_from_resource",
    "master_relaunch_budget",
    "pod_settings",
    "replica_range",
    "resource_from_jobspec",
]
