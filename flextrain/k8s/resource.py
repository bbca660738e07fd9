"""ElasticJob <-> JobSpec: the CRD's camelCase spec and flextrain's one job description.

``jobspec_from_resource`` is what the operator validates on create and what
``flextrain master --job NAME`` runs; ``resource_from_jobspec`` is what
``flextrain train --backend kubernetes`` submits (and ``--dry-run`` prints).

:func:`problems` finds every problem of an ElasticJob at once (what the
operator reports and ``flextrain validate`` prints), each message starting with
the CRD field path (``spec.replicaSpecs.worker.minReplicas (5) > replicas (3)``),
so ``kubectl describe ej/NAME`` tells the user exactly what to fix, all in one
go. ``jobspec_from_resource`` raises them as one :class:`ResourceError`.
JobSpec's own checks speak in CLI flags; their messages are translated to field
paths here (``resource_checks.py``, per-field checks; ``resource_fields.py``, the
spec's fields and :class:`ResourceError`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from flextrain.job import (
    KUBERNETES_DEFAULTS, SETTING, VALUE_RULES, Backend, JobSpec, JobSpecError, JobType, Strategy, check_job_name,
    check_non_negative,
)
from flextrain.k8s import apiserver_checks, hardening, job_types, meta, template, tls_secret
from flextrain.k8s.gang import job_labels
from flextrain.k8s.resource_checks import (MOUNT_KEYS, _check_memory_size, _checkpoint_dir_problems,
                                           _replica_problems, _translate, _unknown_problems, _value_problems,
                                           _volume_problems)
from flextrain.k8s.resource_fields import (CONTROL, FIELDS, NOT_YET, POD_LEVEL, REQUIRED, ResourceError, _get, _set,
                                           path_of)
from flextrain.k8s.traces import inline_trace_problems
from flextrain.k8s.template import ROLES

# Where a job's directory lives inside its pods when the spec names none. Mount
# a persistent volume there: a relaunched master resumes from the ledger and
# checkpoint it finds in the job directory.
DEFAULT_JOBS_ROOT = "/flextrain-jobs"
DEFAULT_MASTER_RELAUNCH_BUDGET = 3


def problems(obj: Mapping[str, Any]) -> list[str]:
    """Every problem of an ElasticJob object (a dict as the API returns it), not just the first.

    Each message starts with the CRD field path it concerns
    (``spec.training.epochs: must be a positive integer, got 0``). Per-field problems come
    first (unknown and required fields, types, value rules, volumes, pod templates, the
    master port annotation), then those between fields (``minReplicas <= replicas <=
    maxReplicas``, strategy and parameter servers, ...), each field blamed once. Empty
    when the job can run. A wrong apiVersion/kind is the only problem reported for a
    document that is not an ElasticJob.
    """
    return _check(obj)[0]


def jobspec_from_resource(obj: Mapping[str, Any]) -> JobSpec:
    """Build and validate the JobSpec of an ElasticJob object (a dict as the API returns it).

    Raises ResourceError listing every problem (:func:`problems`), one per line; its
    ``path`` is the first problem's field.
    """
    found, spec = _check(obj)
    if found:
        raise ResourceError.of(found)
    assert spec is not None
    return spec


def _check(obj: Mapping[str, Any]) -> tuple[list[str], JobSpec | None]:
    """(every problem, the JobSpec when there are none)."""
    if not isinstance(obj, Mapping):
        return [f"(document): must be an object, got {type(obj).__name__}"], None
    if obj.get("apiVersion", meta.API_VERSION) != meta.API_VERSION or obj.get("kind", meta.KIND) != meta.KIND:
        return [f"apiVersion: expected {meta.API_VERSION} {meta.KIND}, got {obj.get('apiVersion')} "
                f"{obj.get('kind')}"], None
    out: list[str] = []
    name = _get(obj, "metadata.name")
    if not isinstance(name, str) or not name:
        out.append("metadata.name: is required")
    else:
        out += _value_problems("metadata.name", name, str, lambda _, value: check_job_name(value))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return [*out, "spec: is required"], None
    out += _unknown_problems(spec, {f.path for f in FIELDS} | set(NOT_YET) | POD_LEVEL | CONTROL)
    out += [f"spec.{path}: is required" for path in REQUIRED if _get(spec, path) in (None, "")]
    out += job_types.required_problems(spec, _get)  # modelDef and data.training, or what spec.jobType needs
    if spec.get("image") not in (None, ""):
        out += _value_problems("spec.image", spec["image"], str)
    budget = _get(spec, "replicaSpecs.master.relaunchBudget")
    if budget is not None:
        out += _value_problems("spec.replicaSpecs.master.relaunchBudget", budget, int, check_non_negative)
    out += _volume_problems(spec.get("volumes")) + tls_secret.problems(spec)
    out += hardening.volume_problems(spec)
    out += inline_trace_problems(_get(spec, "training.batchSchedule"), path="spec.training.batchSchedule")
    out += [f"spec.{path}: is not supported yet: flextrain does not act on it, so the job would run as if it "
            "were not there; remove it" for path in NOT_YET if _get(spec, path) is not None]

    values: dict[str, Any] = {}  # only values that pass their own rules: the cross-field checks see no junk
    for f in FIELDS:
        value = _get(spec, f.path)
        if value is None or f.key in ("strategy", "job_type"):
            continue
        bad = _value_problems(f.full_path, value, f.kind, VALUE_RULES.get(f.key))
        if not bad and f.key == "memory_limit":  # read as the workers read it
            bad = _value_problems(f.full_path, value, f.kind, _check_memory_size)
        if bad:
            out += bad
        else:
            values[f.key] = float(value) if f.kind is float else value
    strategy = _get(spec, "strategy")
    try:
        values["strategy"] = Strategy(strategy if strategy is not None else Strategy.ALLREDUCE.value)
    except ValueError:
        out.append(f"spec.strategy: must be {' | '.join(s.value for s in Strategy)}, got {strategy!r}")
    values["job_type"], bad = job_types.parse(_get(spec, "jobType"))
    if bad:
        out.append(bad)
        del values["job_type"]
    out += _replica_problems(values)
    values.setdefault("job_dir", f"{DEFAULT_JOBS_ROOT}/{name}")
    checkpoint_dir = _get(spec, "training.checkpointDir")
    if checkpoint_dir is not None:
        out += _checkpoint_dir_problems(checkpoint_dir, values["job_dir"])
    try:
        meta.master_port(obj)
    except ValueError as exc:
        out.append(str(exc))
    for role in ROLES:
        replica = _get(spec, f"replicaSpecs.{role}") or {}
        if isinstance(replica, Mapping) and isinstance(replica.get("env") or [], list):  # else reported above
            out += template.problems(spec, role)
    # What the API server would refuse only in the pods and Services made from the spec, later.
    blamed = {path_of(p) for p in out}
    out += [p for p in apiserver_checks.problems(obj) if path_of(p) not in blamed]

    values.setdefault("model_def", "")  # missing: reported above
    values = {**KUBERNETES_DEFAULTS, **values}  # a field left out means the CRD's default, not the local one
    job = JobSpec.of(name=name if isinstance(name, str) else "", backend=Backend.KUBERNETES, **values)
    blamed = {path_of(p) for p in out}
    # Without a valid jobType, JobSpec would judge the fields as a training job's: noise.
    for problem in map(_translate, job.cross_field_problems() if "job_type" in values else ()):
        if path_of(problem) not in blamed:  # one message per field: a bad bound is not blamed twice
            out.append(problem)
            blamed.add(path_of(problem))
    if out:
        return out, None
    try:  # the last word is JobSpec's own: nothing above may accept what it refuses
        return [], job.validate()
    except JobSpecError as exc:
        message = _translate(str(exc))
        return [message if message.startswith(("spec.", "metadata.")) else f"spec: {message}"], None


def replica_range(spec: JobSpec) -> tuple[int, int]:
    """The worker counts a running job may be scaled to."""
    return spec.worker.effective_min_replicas, spec.worker.effective_max_replicas


def master_relaunch_budget(obj: Mapping[str, Any]) -> tuple[int, str]:
    """Times the operator relaunches a master pod that failed or vanished before the job ended, and the
    field that says so: ``spec.backoffLimit`` (Kubernetes' name) wins over the older
    ``spec.replicaSpecs.master.relaunchBudget`` (which the CRD defaults, so both are often there)."""
    for path in ("spec.backoffLimit", "spec.replicaSpecs.master.relaunchBudget"):
        value = _get(obj, path)
        if value is not None:
            return int(value), path
    return DEFAULT_MASTER_RELAUNCH_BUDGET, "spec.replicaSpecs.master.relaunchBudget"


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
    defaults = {**JobSpec.of(name=spec.name, model_def="", job_dir="").settings(), **KUBERNETES_DEFAULTS}
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
        if f.key == "epochs" and value == defaults[f.key] and spec.job_type is not JobType.TRAINING:
            continue  # an evaluation or prediction job reads its data once
        if f.key in ("script_args", "model_def") and not value:  # a script job has no module, maybe no args
            continue
        _set(body, f.path, value.value if isinstance(value, enum.Enum) else list(value) if f.key == "script_args"
             else value)
    for path, value in (pod_fields or {}).items():
        if path not in POD_LEVEL:
            raise ResourceError(f"spec.{path}", "is not a pod-level field")
        _set(body, path, value)
    metadata: dict[str, Any] = {"name": spec.name}
    if labels := job_labels(spec.scheduling.gang, spec.scheduling.queue):  # Kueue finds its jobs by label
        metadata["labels"] = labels
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": metadata, "spec": body}


__all__ = [
    "DEFAULT_JOBS_ROOT",
    "DEFAULT_MASTER_RELAUNCH_BUDGET",
    "FIELDS",
    "MOUNT_KEYS",
    "NOT_YET",
    "ResourceError",
    "jobspec_from_resource",
    "master_relaunch_budget",
    "path_of",
    "problems",
    "replica_range",
    "resource_from_jobspec",
]
