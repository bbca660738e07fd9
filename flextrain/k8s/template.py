"""Pod templates: ``spec.replicaSpecs.{master,worker,ps}.template``, the Kubeflow/JobSet way.

A template is a PodTemplateSpec reduced to what a user of a shared cluster
needs to place and harden a job's pods::

    template:
      metadata: {labels: {...}, annotations: {...}}
      spec:
        nodeSelector / tolerations / affinity / topologySpreadConstraints / schedulerName
        securityContext / serviceAccountName / imagePullSecrets / priorityClassName
        runtimeClassName / volumes / automountServiceAccountToken
        containers:            # at most one: flextrain's own container of the role
        - name: worker         # optional; if given, the role's name
          image / imagePullPolicy / resources / env / envFrom / volumeMounts / securityContext

Contract:

* The template is merged *under* flextrain's own fields: the container's
  command, arguments, ports and identity variables (``FLEXTRAIN_*``), the
  pod's restartPolicy, owner and ``flextrain.dev/*`` labels are flextrain's.
  A template that sets one of them is refused, naming it (never silently
  overridden); so is a field this module does not carry, and a field set
  both in the template and by its shorthand (``replicaSpecs.<role>.resources``,
  ``.env``, ``.priorityClassName``, ``spec.image``, ``spec.imagePullPolicy``).
* Everything else is checked against Kubernetes' own schema
  (:mod:`flextrain.k8s.kubeschema`) at admission, so a typo is reported when
  the job is created, not when a pod is refused.
* Without a template, pods pass a PodSecurity ``restricted`` namespace:
  non-root (uid/gid 10001, the image's user), no privilege escalation, every
  capability dropped, seccomp ``RuntimeDefault``. A template's
  ``securityContext`` entries override these defaults key by key.
* Least privilege (:mod:`flextrain.k8s.hardening`): a read-only root
  filesystem (the container's ``securityContext.readOnlyRootFilesystem:
  false`` turns it off) and, for workers and parameter servers, no
  ServiceAccount token (``automountServiceAccountToken: true`` mounts one).
* The ElasticJob's ``metadata.labels`` reach every pod (before the
  template's labels, which win; flextrain's own labels win over both).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flextrain.k8s import kubeschema, meta

ROLES = ("master", "worker", "ps")
POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "schedulerName",
              "securityContext", "serviceAccountName", "imagePullSecrets", "priorityClassName",
              "runtimeClassName", "volumes", "containers", "automountServiceAccountToken")
CONTAINER_FIELDS = ("name", "image", "imagePullPolicy", "resources", "env", "envFrom", "volumeMounts",
                    "securityContext")
# Set by flextrain on every pod: a template may not change them.
OWNED_POD = ("restartPolicy", "initContainers", "hostname", "subdomain")
OWNED_CONTAINER = ("command", "args", "ports", "terminationMessagePolicy")
# Shorthand (path below spec.replicaSpecs.<role>, or below spec when it starts with "/") -> template path.
SHORTHANDS = {"resources": "containers[0].resources", "env": "containers[0].env",
              "priorityClassName": "priorityClassName", "/image": "containers[0].image",
              "/imagePullPolicy": "containers[0].imagePullPolicy"}
# What a `restricted` PodSecurity namespace requires; the Dockerfile's user is 10001.
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# Variables flextrain sets in every container (besides FLEXTRAIN_*).
OWNED_ENV = ("PYTHONUNBUFFERED",)


@dataclass(frozen=True)
class Template:
    """One role's template, checked, split into what the pod builder needs."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    pod: Mapping[str, Any] = field(default_factory=dict)  # PodSpec fields (no containers, no volumes)
    volumes: tuple[dict[str, Any], ...] = ()
    container: Mapping[str, Any] = field(default_factory=dict)  # container fields (no name)


def _base(role: str) -> str:
    return f"spec.replicaSpecs.{role}.template"


def env_owned(name: str) -> bool:
    return name.startswith("FLEXTRAIN_") or name in OWNED_ENV


def problems(spec: Mapping[str, Any], role: str) -> list[str]:
    """Every problem of ``spec.replicaSpecs.<role>.template`` (and of the role's env shorthand), by path."""
    replica = ((spec.get("replicaSpecs") or {}).get(role) or {}) if isinstance(spec.get("replicaSpecs"), Mapping) else {}
    out = [f"spec.replicaSpecs.{role}.env[{i}].name: {e.get('name')!r} is set by flextrain (the pod's identity); "
           "use another name" for i, e in enumerate(replica.get("env") or ())
           if isinstance(e, Mapping) and isinstance(e.get("name"), str) and env_owned(e["name"])]
    raw = replica.get("template") if isinstance(replica, Mapping) else None
    if raw is None:
        return out
    base = _base(role)
    if not isinstance(raw, Mapping):
        return [*out, f"{base}: must be an object (metadata, spec), got {raw!r}"]
    out += [f"{base}.{k}: unknown field (a template has metadata and spec)" for k in raw if k not in ("metadata", "spec")]
    md = raw.get("metadata") or {}
    if not isinstance(md, Mapping):
        out.append(f"{base}.metadata: must be an object, got {md!r}")
        md = {}
    for key in md:
        if key not in ("labels", "annotations"):
            out.append(f"{base}.metadata.{key}: {'is set by flextrain' if key in ('name', 'namespace', 'ownerReferences') else 'not supported (labels and annotations are)'}")
    for kind in ("labels", "annotations"):
        values = md.get(kind) or {}
        if not isinstance(values, Mapping) or not all(isinstance(v, str) for v in values.values()):
            out.append(f"{base}.metadata.{kind}: must map names to strings, got {values!r}")
            continue
        out += [f"{base}.metadata.{kind}.{k}: the {meta.GROUP}/ prefix is flextrain's" for k in values
                if k.startswith(f"{meta.GROUP}/")]
    pod = raw.get("spec") or {}
    if not isinstance(pod, Mapping):
        return [*out, f"{base}.spec: must be an object, got {pod!r}"]
    for key in pod:
        if key in OWNED_POD:
            out.append(f"{base}.spec.{key}: is set by flextrain")
        elif key not in POD_FIELDS:
            out.append(f"{base}.spec.{key}: not supported in a flextrain pod template (supported: "
                       f"{', '.join(POD_FIELDS)})")
    containers = pod.get("containers") or []
    if not isinstance(containers, list) or len(containers) > 1 or not all(isinstance(c, Mapping) for c in containers):
        out.append(f"{base}.spec.containers: at most one container (flextrain's own, named {role!r}); "
                   "sidecars are not supported")
        containers = []
    container = dict(containers[0]) if containers else {}
    where = f"{base}.spec.containers[0]"
    for key in container:
        if key in OWNED_CONTAINER:
            out.append(f"{where}.{key}: is set by flextrain")
        elif key not in CONTAINER_FIELDS:
            out.append(f"{where}.{key}: not supported (supported: {', '.join(CONTAINER_FIELDS)})")
    if container.get("name", role) != role:
        out.append(f"{where}.name: must be {role!r} (flextrain names the container after its role) or left out")
    for i, e in enumerate(container.get("env") or ()):
        if isinstance(e, Mapping) and isinstance(e.get("name"), str) and env_owned(e["name"]):
            out.append(f"{where}.env[{i}].name: {e['name']!r} is set by flextrain (the pod's identity)")
    for short, target in SHORTHANDS.items():
        given = spec.get(short[1:]) if short.startswith("/") else replica.get(short)
        head, _, leaf = target.rpartition(".")
        templated = container.get(leaf) if head == "containers[0]" else pod.get(target)
        if given is not None and templated is not None:
            short_path = f"spec.{short[1:]}" if short.startswith("/") else f"spec.replicaSpecs.{role}.{short}"
            out.append(f"{base}.spec.{target}: also set by {short_path}; set it in one place")
    # The pod gets spec.volumes and the template's volumes side by side: one name, one volume.
    job_volumes = {v.get("name") for v in spec.get("volumes") or () if isinstance(v, Mapping)}
    for i, volume in enumerate(pod.get("volumes") or () if isinstance(pod.get("volumes"), list) else ()):
        if isinstance(volume, Mapping) and volume.get("name") in job_volumes:
            out.append(f"{base}.spec.volumes[{i}].name: {volume['name']!r} is also a volume of spec.volumes; "
                       "rename one")
    # Kubernetes' schema for everything the template carries (the container completed as flextrain would).
    checked = {k: v for k, v in pod.items() if k in POD_FIELDS}
    checked["containers"] = [{**{k: v for k, v in container.items() if k in CONTAINER_FIELDS},
                              "name": role, "image": container.get("image") or "flextrain"}]
    out += kubeschema.problems(checked, "io.k8s.api.core.v1.PodSpec", path=f"{base}.spec")
    return out


def template_of(spec: Mapping[str, Any], role: str) -> Template:
    """The role's template (an empty one when there is none); assumes :func:`problems` found none."""
    raw = (((spec.get("replicaSpecs") or {}).get(role) or {}).get("template")) or {}
    md = raw.get("metadata") or {}
    pod = dict(raw.get("spec") or {})
    containers = pod.pop("containers", None) or [{}]
    volumes = tuple(copy.deepcopy(v) for v in pod.pop("volumes", None) or ())
    container = {k: copy.deepcopy(v) for k, v in containers[0].items() if k != "name"}
    return Template(labels=dict(md.get("labels") or {}), annotations=dict(md.get("annotations") or {}),
                    pod=copy.deepcopy(pod), volumes=volumes, container=container)


def security_context(defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The restricted defaults with the template's entries over them, key by key."""
    return {**copy.deepcopy(dict(defaults)), **copy.deepcopy(dict(given or {}))}


def pod_labels(job: Mapping[str, Any], template: Template, ours: Mapping[str, str]) -> dict[str, str]:
    """Job labels, then the template's, then flextrain's own (which nothing overrides)."""
    job_labels = {k: v for k, v in (((job.get("metadata") or {}).get("labels")) or {}).items()
                  if not k.startswith(f"{meta.GROUP}/")}
    return {**job_labels, **template.labels, **ours}


__all__ = ["CONTAINER_FIELDS", "POD_FIELDS", "RESTRICTED_CONTAINER", "RESTRICTED_POD", "ROLES", "Template",
           "env_owned", "pod_labels", "problems", "security_context", "template_of"]
