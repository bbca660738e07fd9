"""What the API server will refuse in the pods and Services an ElasticJob becomes, checked at admission.

The CRD keeps resources, env, volumes and pod templates open
(``x-kubernetes-preserve-unknown-fields``, int-or-string quantities), and
Kubernetes' OpenAPI schema (:mod:`flextrain.k8s.kubeschema`) knows only
types and field names: it has no enums for a toleration's operator, no
name formats, no "requests <= limits". The API server checks those only when
the operator or the master creates a pod or Service, long after the job was
accepted (a worker pod refused mid-run fails the job). These are the
API server's own rules (``k8s.io/kubernetes/pkg/apis/core/validation``) for
the parts an ElasticJob carries, reported with the ElasticJob field path, the
value and what is allowed, so ``flextrain validate`` and the operator's
``InvalidSpec`` catch them when the job is created. Kubernetes 1.25 is the
oldest supported server, so its stricter rules are the ones applied (an
environment variable name, for one, is a C-like identifier there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from flextrain.k8s import hardening, kubeschema, meta, tls_secret
from flextrain.k8s.template import ROLES

# k8s.io/apimachinery/pkg/api/resource: sign, number, then a binary (Ki..Ei), decimal (n u m k M G T P E)
# or exponent suffix. The same pattern the CRD puts on spec.replicaSpecs.*.resources.
_QUANTITY = re.compile(r"^([+-]?)((?:[0-9]+(?:\.[0-9]*)?)|(?:\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|"
                       r"(?:[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)))?$")
QUANTITY_HELP = ("a number with an optional suffix: Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024) or m, k, M, G, T, P, E "
                 "(powers of 1000), no space, e.g. 500m, 2Gi")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_VALUE_FROM = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_OBJECT_NAME = "a Kubernetes object name: lower-case letters, digits, '-' and '.', starting and ending alphanumeric"


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity's value (``2Gi`` -> 2147483648), None when ``value`` is not one. The API
    server's pattern decides what is one (the client's parser also takes ``4 Gi``, which it refuses)."""
    from kubernetes.utils import parse_quantity as quantity_value

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str) and not _QUANTITY.match(value):
        return None
    try:
        return Decimal(quantity_value(value))
    except (ValueError, InvalidOperation):
        return None


def quantity_problem(path: str, value: Any) -> str | None:
    """``path: <value> is not a Kubernetes quantity: <what is>`` (with the likely fix of ``2GB``), or None."""
    if parse_quantity(value) is not None:
        return None
    hint = ""
    if isinstance(value, str) and (m := re.fullmatch(r"\s*([0-9.]+)\s*([KkMGTPE])(i?)[Bb]?\s*", value)):
        number, prefix, binary = m.groups()
        prefix = "k" if prefix == "K" and not binary else prefix.upper() if prefix == "k" and binary else prefix
        hint = (f"; write {number}{prefix}i (powers of 1024)" if binary else
                f"; write {number}{prefix} (powers of 1000) or {number}{prefix.upper()}i (powers of 1024)")
    return f"{path}: {value!r} is not a Kubernetes quantity: {QUANTITY_HELP}{hint}"


def _qualified_name_problem(path: str, key: Any, what: str) -> str | None:
    """Label and annotation keys, resource names, toleration keys: ``[prefix/]name``."""
    prefix, _, name = key.rpartition("/") if isinstance(key, str) else ("", "", "")
    if (isinstance(key, str) and len(name) <= 63 and _NAME_PART.match(name)
            and (not prefix or (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)))):
        return None
    return (f"{path}: {key!r} is not a valid {what}: an optional DNS-subdomain prefix and '/', then at most 63 "
            "letters, digits, '-', '_' and '.', starting and ending with a letter or digit")


def _label_problems(path: str, labels: Any) -> list[str]:
    if not isinstance(labels, Mapping):
        return []  # the schema or the template check reports its type
    out = []
    for key, value in labels.items():
        if bad := _qualified_name_problem(f"{path}.{key}", key, "label key"):
            out.append(bad)
        if isinstance(value, str) and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            out.append(f"{path}.{key}: {value!r} is not a valid label value: at most 63 letters, digits, '-', '_' "
                       "and '.', starting and ending with a letter or digit (or empty)")
    return out


def _extended(name: str) -> bool:
    """A resource of a device plugin or the like (``nvidia.com/gpu``): whole units, never overcommitted."""
    prefix = name.rpartition("/")[0]
    return bool(prefix) and not prefix.endswith("kubernetes.io") and not name.startswith("requests.")


def resources_problems(path: str, resources: Any) -> list[str]:
    """A container's ``resources``: names, quantities, ``requests <= limits``, whole extended resources."""
    if not isinstance(resources, Mapping):
        return []
    out, parsed = [], {}
    for kind in ("limits", "requests"):
        values = resources.get(kind)
        if not isinstance(values, Mapping):
            continue
        for name, value in values.items():
            where = f"{path}.{kind}.{name}"
            if "/" not in str(name) and str(name) not in _STANDARD_RESOURCES and not str(name).startswith("hugepages-"):
                out.append(f"{where}: unknown resource {name!r}: cpu, memory, ephemeral-storage, hugepages-<size> "
                           "or a prefixed extended resource such as nvidia.com/gpu")
                continue
            if bad := _qualified_name_problem(where, name, "resource name"):
                out.append(bad)
                continue
            amount = parse_quantity(value)
            if amount is None:
                out.append(quantity_problem(where, value))
            elif amount < 0:
                out.append(f"{where}: {value!r} must be at least 0")
            elif _extended(name) and amount != amount.to_integral_value():
                out.append(f"{where}: {value!r} must be a whole number: an extended resource such as {name} is "
                           "allocated in whole units (fractions need the device plugin's own sharing)")
            else:
                parsed[kind, name] = (amount, value)
    for (kind, name), (amount, value) in parsed.items():
        if kind != "requests":
            continue
        limit = parsed.get(("limits", name))
        if limit is not None and amount > limit[0]:
            out.append(f"{path}.requests.{name}: {value!r} must be at most limits.{name} ({limit[1]!r})")
        elif _extended(name) and limit is not None and amount != limit[0]:
            out.append(f"{path}.requests.{name}: {value!r} must equal limits.{name} ({limit[1]!r}): an extended "
                       "resource cannot be overcommitted")
        elif _extended(name) and ("limits", name) not in parsed and name not in (resources.get("limits") or {}):
            out.append(f"{path}.requests.{name}: an extended resource needs limits.{name} too (equal to the request)")
    return out


def env_problems(path: str, env: Any, *, schema: bool) -> list[str]:
    """A container's ``env``: names, ``value`` xor one ``valueFrom`` source; with ``schema``, Kubernetes'
    schema of ``valueFrom`` too (the CRD keeps it open, so ``secretKeyRf`` would pass it; the CRD itself
    types ``name`` and ``value``, and a template's env is checked with its PodSpec)."""
    if not isinstance(env, list):
        return []
    out = []
    for i, var in enumerate(env):
        where = f"{path}[{i}]"
        if not isinstance(var, Mapping):
            continue  # the schema reports it
        source = var.get("valueFrom")
        typos = kubeschema.problems(dict(source), "io.k8s.api.core.v1.EnvVarSource", path=f"{where}.valueFrom") \
            if schema and isinstance(source, Mapping) else []
        out += typos
        name = var.get("name")
        if isinstance(name, str) and not _ENV_NAME.match(name):
            out.append(f"{where}.name: {name!r} is not a valid environment variable name: letters, digits, '_', "
                       "'-' and '.', not starting with a digit")
        if source is not None and var.get("value") not in (None, ""):
            out.append(f"{where}: has both value and valueFrom; set one")
        if isinstance(source, Mapping) and not typos:
            given = [k for k in _VALUE_FROM if source.get(k) is not None]
            if len(given) != 1:
                out.append(f"{where}.valueFrom: must name exactly one of {', '.join(_VALUE_FROM)}"
                           + (f", got {', '.join(given)}" if given else ""))
    return out


def _volume_source_problem(where: str, volume: Mapping[str, Any], ignore: tuple[str, ...]) -> str | None:
    sources = [k for k in volume if k not in ("name", *ignore)]
    if len(sources) > 1:
        return f"{where}: has {len(sources)} volume sources ({', '.join(sources)}); a volume has one"
    return None


def volume_problems(spec: Mapping[str, Any]) -> list[str]:
    """Volume names (DNS labels, one volume per name in a pod), one source per volume, one volume per
    mountPath, and template volumeMounts that name a volume the pod has."""
    from flextrain.k8s.resource_checks import MOUNT_KEYS

    out = []
    job_volumes = [v for v in spec.get("volumes") or () if isinstance(v, Mapping)] \
        if isinstance(spec.get("volumes"), list) else []
    seen_names: dict[Any, str] = {}
    seen_paths: dict[Any, str] = {}
    for i, volume in enumerate(job_volumes):
        where = f"spec.volumes[{i}]"
        out += _volume_name_problems(f"{where}.name", volume.get("name"), seen_names)
        path = volume.get("mountPath")
        if isinstance(path, str) and path:
            if path.rstrip("/") in seen_paths:
                out.append(f"{where}.mountPath: {path!r} is also the mountPath of {seen_paths[path.rstrip('/')]}; "
                           "one volume per path")
            seen_paths.setdefault(path.rstrip("/"), f"{where}")
        if bad := _volume_source_problem(where, volume, MOUNT_KEYS):
            out.append(bad)
    for role in ROLES:
        pod = _template_pod(spec, role)
        if pod is None:
            continue
        base = f"spec.replicaSpecs.{role}.template.spec"
        names = dict(seen_names)
        volumes = pod.get("volumes") if isinstance(pod.get("volumes"), list) else []
        for i, volume in enumerate(volumes):
            if not isinstance(volume, Mapping):
                continue
            if volume.get("name") not in seen_names:  # a clash with spec.volumes is template.py's message
                out += _volume_name_problems(f"{base}.volumes[{i}].name", volume.get("name"), names)
            if bad := _volume_source_problem(f"{base}.volumes[{i}]", volume, ()):
                out.append(bad)
        known = {*names, *hardening.RESERVED_VOLUMES, tls_secret.VOLUME}
        containers = pod.get("containers")
        container = containers[0] if isinstance(containers, list) and containers else {}
        mounts = container.get("volumeMounts") if isinstance(container, Mapping) else None
        paths = dict(seen_paths)
        for i, mount in enumerate(mounts if isinstance(mounts, list) else ()):
            if not isinstance(mount, Mapping):
                continue
            where = f"{base}.containers[0].volumeMounts[{i}]"
            if isinstance(mount.get("name"), str) and mount["name"] not in known:
                out.append(f"{where}.name: no volume named {mount['name']!r} in the pod (spec.volumes and this "
                           f"template's volumes have: {', '.join(sorted(map(str, names))) or 'none'})")
            path = mount.get("mountPath")
            if isinstance(path, str) and path:
                if path.rstrip("/") in paths:
                    out.append(f"{where}.mountPath: {path!r} is also the mountPath of {paths[path.rstrip('/')]}; "
                               "one volume per path")
                paths.setdefault(path.rstrip("/"), where)
    return out


def _volume_name_problems(where: str, name: Any, seen: dict[Any, str]) -> list[str]:
    out = []
    if isinstance(name, str) and name and (len(name) > 63 or not _DNS_LABEL.match(name)):
        out.append(f"{where}: {name!r} is not a valid volume name: a DNS label (at most 63 lower-case letters, "
                   "digits and '-', starting and ending alphanumeric)")
    if isinstance(name, str) and name in seen:
        out.append(f"{where}: {name!r} is also the name of {seen[name].removesuffix('.name')}; volume names must "
                   "be unique")
    elif isinstance(name, str):
        seen[name] = where
    return out


def _template_pod(spec: Mapping[str, Any], role: str) -> Mapping[str, Any] | None:
    replica = (spec.get("replicaSpecs") or {}).get(role) if isinstance(spec.get("replicaSpecs"), Mapping) else None
    template = replica.get("template") if isinstance(replica, Mapping) else None
    pod = template.get("spec") if isinstance(template, Mapping) else None
    return pod if isinstance(pod, Mapping) else None


def toleration_problems(path: str, tolerations: Any) -> list[str]:
    out = []
    for i, t in enumerate(tolerations if isinstance(tolerations, list) else ()):
        if not isinstance(t, Mapping):
            continue
        where = f"{path}[{i}]"
        operator, effect, key = t.get("operator") or "Equal", t.get("effect") or "", t.get("key") or ""
        if operator not in ("Equal", "Exists"):
            out.append(f"{where}.operator: must be Equal or Exists, got {t.get('operator')!r}")
        if effect and effect not in _EFFECTS:
            out.append(f"{where}.effect: must be {', '.join(_EFFECTS)} or empty (every effect), got {effect!r}")
        if key and (bad := _qualified_name_problem(f"{where}.key", key, "taint key")):
            out.append(bad)
        if not key and operator == "Equal":
            out.append(f"{where}.operator: must be Exists when key is empty (tolerating every taint)")
        if operator == "Exists" and t.get("value"):
            out.append(f"{where}.value: must be empty when operator is Exists, got {t['value']!r}")
        if t.get("tolerationSeconds") is not None and effect not in ("NoExecute", ""):
            out.append(f"{where}.tolerationSeconds: applies to effect NoExecute only, got effect {effect!r}")
    return out


def _object_name_problem(path: str, value: Any) -> str | None:
    if isinstance(value, str) and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
        return f"{path}: must be {_OBJECT_NAME}, got {value!r}"
    return None


def problems(obj: Mapping[str, Any]) -> list[str]:
    """Everything above for the ElasticJob ``obj``, by field path."""
    out = []
    name = (obj.get("metadata") or {}).get("name")
    if isinstance(name, str) and name[:1].isdigit():
        out.append(f"metadata.name: {name!r} must start with a letter: the job's Service "
                   f"{meta.master_service_name(name)!r} must be a DNS-1035 label (lower-case letters, digits and "
                   "'-', starting with a letter)")
    out += _label_problems("metadata.labels", (obj.get("metadata") or {}).get("labels"))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return out
    job_dir = spec.get("jobDir")
    if isinstance(job_dir, str) and job_dir and not job_dir.startswith("/"):
        out.append(f"spec.jobDir: must be an absolute path inside the pods (whose root filesystem is read-only: "
                   f"put it on a volume of spec.volumes), got {job_dir!r}")
    out += _metrics_port_problems(obj, spec)
    out += _ladder_problems(spec)
    out += volume_problems(spec)
    replicas = spec.get("replicaSpecs") if isinstance(spec.get("replicaSpecs"), Mapping) else {}
    for role in ROLES:
        replica = replicas.get(role)
        if not isinstance(replica, Mapping):
            continue
        base = f"spec.replicaSpecs.{role}"
        out += resources_problems(f"{base}.resources", replica.get("resources"))
        out += env_problems(f"{base}.env", replica.get("env"), schema=True)
        if role != "worker":  # the worker's is one of JobSpec's settings, checked with it
            out += [bad] if (bad := _object_name_problem(f"{base}.priorityClassName",
                                                          replica.get("priorityClassName"))) else []
        out += _template_problems(f"{base}.template", replica.get("template"))
    return out


def _template_problems(base: str, template: Any) -> list[str]:
    if not isinstance(template, Mapping):
        return []
    out = []
    md = template.get("metadata")
    if isinstance(md, Mapping):
        out += _label_problems(f"{base}.metadata.labels", md.get("labels"))
        annotations = md.get("annotations")
        for key in annotations if isinstance(annotations, Mapping) else ():
            out += [bad] if (bad := _qualified_name_problem(f"{base}.metadata.annotations.{key}", key,
                                                            "annotation key")) else []
    pod = template.get("spec")
    if not isinstance(pod, Mapping):
        return out
    out += _label_problems(f"{base}.spec.nodeSelector", pod.get("nodeSelector"))
    out += toleration_problems(f"{base}.spec.tolerations", pod.get("tolerations"))
    out += [bad] if (bad := _object_name_problem(f"{base}.spec.priorityClassName", pod.get("priorityClassName"))) else []
    containers = pod.get("containers")
    if isinstance(containers, list) and len(containers) == 1 and isinstance(containers[0], Mapping):
        where = f"{base}.spec.containers[0]"
        out += resources_problems(f"{where}.resources", containers[0].get("resources"))
        # (the PodSpec schema check of template.py already covers an env entry's fields)
        out += env_problems(f"{where}.env", containers[0].get("env"), schema=False)
    return out


def _metrics_port_problems(obj: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    port = spec.get("metricsPort")
    if spec.get("metrics") is False or not isinstance(port, int) or isinstance(port, bool) or not port:
        return []
    try:
        master = meta.master_port(obj)
    except ValueError:
        return []  # reported on its own
    if port == master:
        return [f"spec.metricsPort: {port} is the master's gRPC port (metadata.annotations"
                f"[{meta.ANNOTATION_MASTER_PORT}], default {meta.MASTER_PORT}); choose another port, e.g. "
                f"{meta.METRICS_PORT}"]
    return []


def _ladder_problems(spec: Mapping[str, Any]) -> list[str]:
    """``replicaSpecs.worker.memoryLadder``: quantities, smallest first (read only after an OOM kill, so a
    bad rung would otherwise fail the job long after it started)."""
    worker = (spec.get("replicaSpecs") or {}).get("worker") if isinstance(spec.get("replicaSpecs"), Mapping) else None
    ladder = worker.get("memoryLadder") if isinstance(worker, Mapping) else None
    if not isinstance(ladder, list):
        return []
    out, previous = [], None
    for i, size in enumerate(ladder):
        where = f"spec.replicaSpecs.worker.memoryLadder[{i}]"
        amount = parse_quantity(size)
        if amount is None:
            out.append(quantity_problem(where, size))
            continue
        if amount <= 0:
            out.append(f"{where}: {size!r} must be more than 0")
        elif previous is not None and amount <= previous[0]:
            out.append(f"{where}: {size!r} must be larger than the size before it ({previous[1]!r}): the ladder "
                       "goes smallest first, each OOM kill climbing one size")
        previous = (amount, size) if amount > 0 else previous
    return out


__all__ = ["QUANTITY_HELP", "env_problems", "parse_quantity", "problems", "quantity_problem", "resources_problems",
           "toleration_problems", "volume_problems"]
