"""Worker and parameter-server Pods (and a Service per PS) of an ElasticJob.

The master's Kubernetes launch backend creates these, one Pod per launched
instance. A Pod is named ``<job>-<instance id>`` (instance ids are
``worker-<i>`` / ``ps-<i>``, so this is ``meta.pod_name(job, role, i)``),
labelled job/role/index, owned by the ElasticJob (deleting the job removes
it), runs as ServiceAccount ``flextrain-job`` with ``restartPolicy: Never``
(the master, not the kubelet, decides about relaunches; the master's own pod runs as
its job's ServiceAccount, :mod:`flextrain.k8s.access`), with a read-only root
filesystem and, but for the master, no API token (:mod:`flextrain.k8s.hardening`), and gets the
job's image, the role's ``resources``, ``priorityClassName`` and ``env`` from
``spec.replicaSpecs.<role>``, every ``spec.volumes`` entry (see
:func:`pod_settings`), the role's pod template
(``spec.replicaSpecs.<role>.template``: placement, security, pull Secrets,
labels; :mod:`flextrain.k8s.template`), the job's labels and, with ``spec.tls`` on, the job's TLS
Secret (:mod:`flextrain.k8s.tls_secret`). Without a
template it passes a PodSecurity ``restricted`` namespace. Its container runs
``flextrain <args>`` with the instance's arguments and environment plus the
identity variables of ``meta`` (namespace, job, role, instance id, master
address, pod IP from the downward API). The user's ``env`` may add
variables, never override the identity ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flextrain.k8s import gang, hardening, meta, tls_secret
from flextrain.k8s.resource import DEFAULT_JOBS_ROOT, MOUNT_KEYS
from flextrain.k8s.template import RESTRICTED_CONTAINER, RESTRICTED_POD, pod_labels, security_context, template_of


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


def pod_settings(obj: Mapping[str, Any], role: str) -> PodSettings:
    """The pod-level fields of ``obj`` for ``role``; ``spec.volumes`` split into volumes and mounts.

    An ElasticJob volume is a core/v1 Volume plus ``mountPath``/``readOnly``/``subPath``;
    every pod of the job mounts every volume.
    """
    spec = obj.get("spec") or {}
    replica = (spec.get("replicaSpecs") or {}).get(role) or {}
    volumes, mounts = [], []
    for volume in spec.get("volumes") or ():
        volumes.append({k: v for k, v in volume.items() if k not in MOUNT_KEYS})
        mounts.append({"name": volume["name"], **{k: volume[k] for k in MOUNT_KEYS if k in volume}})
    return PodSettings(
        image=spec.get("image", ""), image_pull_policy=spec.get("imagePullPolicy"),
        resources=replica.get("resources"), priority_class_name=replica.get("priorityClassName"),
        env=tuple(replica.get("env") or ()), volumes=tuple(volumes), volume_mounts=tuple(mounts),
    )


def ps_port(job: Mapping[str, Any], index: int) -> int:
    """The port parameter server ``index`` listens on and its Service exposes: ``meta.PS_PORT``,
    or ``BASE + index`` with the annotation ``flextrain.dev/ps-port-base: BASE``."""
    raw = ((job.get("metadata") or {}).get("annotations") or {}).get(meta.ANNOTATION_PS_PORT_BASE)
    if raw is None:
        return meta.PS_PORT
    try:
        base = int(raw)
    except ValueError:
        base = -1
    if not 0 < base < 65536 - index:
        raise ValueError(f"metadata.annotations[{meta.ANNOTATION_PS_PORT_BASE}]: not a port number for "
                         f"parameter server {index}: {raw!r}")
    return base + index


def memory_ladder(job: Mapping[str, Any]) -> tuple[str, ...]:
    """``spec.replicaSpecs.worker.memoryLadder``: the memory sizes an OOMKilled worker's pods climb, as strings."""
    ladder = (((job.get("spec") or {}).get("replicaSpecs") or {}).get("worker") or {}).get("memoryLadder") or ()
    return tuple(str(size) for size in ladder)


def instance_pod_name(job_name: str, instance_id: str) -> str:
    """``<job>-<instance id>``: e.g. ``digits-worker-3`` for instance ``worker-3``."""
    return f"{job_name}-{instance_id}"


def instance_pod(
    job: Mapping[str, Any],
    *,
    role: str,
    index: int,
    instance_id: str,
    args: Sequence[str],
    env: Mapping[str, str],
    master_address: str,
    spare: bool = False,
    priority_class_name: str | None = None,
    memory: str | None = None,
) -> dict[str, Any]:
    """The Pod of one worker or PS instance of ``job`` (an ElasticJob dict with metadata.uid); a ``spare``
    worker's pod is labelled ``flextrain.dev/spare: "true"``; ``priority_class_name`` overrides the role's
    (a worker of the elastic part: flextrain/master/k8s_priority.py); ``memory`` (a memory ladder's size)
    replaces the memory limit and request of the role's resources."""
    pod = job_pod(job, role=role, index=index, pod_name=instance_pod_name(job["metadata"]["name"], instance_id),
                  instance_id=instance_id, args=args, env=env, master_address=master_address,
                  port=ps_port(job, index) if role == "ps" else None)
    if priority_class_name:
        pod["spec"]["priorityClassName"] = priority_class_name
    if spare:
        pod["metadata"]["labels"][meta.LABEL_SPARE] = "true"
    if memory:
        container = pod["spec"]["containers"][0]
        resources = container.get("resources") or {}  # new dicts: the job's own resources stay as they are
        container["resources"] = {**resources, "limits": {**(resources.get("limits") or {}), "memory": memory},
                                  "requests": {**(resources.get("requests") or {}), "memory": memory}}
    return pod


# The roles that read the job's data (spec.data.secretRef's keys become their environment); PS never do.
DATA_ROLES = ("master", "worker")


def job_pod(
    job: Mapping[str, Any],
    *,
    role: str,
    index: int,
    pod_name: str,
    instance_id: str,
    args: Sequence[str],
    env: Mapping[str, str],
    master_address: str,
    port: int | None = None,
    service_account: str = meta.JOB_SERVICE_ACCOUNT,
) -> dict[str, Any]:
    """Any Pod of ``job`` (master, worker or PS): identity env, the role's settings and template,
    owner and labels; it runs as ``service_account`` unless the template names another.

    The role's template (:mod:`flextrain.k8s.template`) is laid under flextrain's own fields;
    admission (:func:`flextrain.k8s.template.problems`) has already refused a template that sets
    one of them, so nothing here silently overrides what the user wrote.
    """
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    settings = pod_settings(job, role)
    tpl = template_of(job.get("spec") or {}, role)
    ours = [
        {"name": meta.ENV_NAMESPACE, "value": namespace},
        {"name": meta.ENV_JOB_NAME, "value": name},
        {"name": meta.ENV_ROLE, "value": role},
        {"name": meta.ENV_INSTANCE_ID, "value": instance_id},
        {"name": meta.ENV_MASTER_ADDR, "value": master_address},
        {"name": meta.ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": meta.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        *({"name": k, "value": str(v)} for k, v in env.items()),
    ]
    taken = {e["name"] for e in ours}
    user_env = [*settings.env, *(tpl.container.get("env") or ())]
    container: dict[str, Any] = {
        **tpl.container,
        "name": role,
        "image": tpl.container.get("image") or settings.image,
        "command": ["flextrain"],
        "args": list(args),
        # The pod's identity is ours to set; a user's env may add to it, not change it.
        "env": [dict(e) for e in user_env if e.get("name") not in taken] + ours,
        # A container that fails keeps the end of its output in its status: the master names
        # it in the job's failure even when the process died before it could report.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security_context(RESTRICTED_CONTAINER, tpl.container.get("securityContext")),
    }
    if port is not None:
        container["ports"] = [{"name": "grpc", "containerPort": port, "protocol": "TCP"}]
    if settings.image_pull_policy:
        container["imagePullPolicy"] = settings.image_pull_policy
    if settings.resources:
        container["resources"] = dict(settings.resources)
    secret = ((job.get("spec") or {}).get("data") or {}).get("secretRef")
    if secret and role in DATA_ROLES:  # the database password, as environment: never in the data URL
        container["envFrom"] = [*(tpl.container.get("envFrom") or ()), {"secretRef": {"name": secret}}]
    mounts = [*(dict(m) for m in settings.volume_mounts), *(tpl.container.get("volumeMounts") or ())]
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict[str, Any] = {
        **tpl.pod,
        "restartPolicy": "Never",
        "serviceAccountName": tpl.pod.get("serviceAccountName") or service_account,
        "securityContext": security_context(RESTRICTED_POD, tpl.pod.get("securityContext")),
        "containers": [container],
    }
    if settings.priority_class_name:
        spec["priorityClassName"] = settings.priority_class_name
    volumes = [*(dict(v) for v in settings.volumes), *tpl.volumes]
    if volumes:
        spec["volumes"] = volumes
    metadata: dict[str, Any] = {
        "name": pod_name,
        "namespace": namespace,
        "labels": pod_labels(job, tpl, meta.labels(name, role, index)),
        "ownerReferences": [meta.owner_reference(job)],
    }
    if tpl.annotations:
        metadata["annotations"] = dict(tpl.annotations)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    hardening.harden(pod, role=role, job_dir=(job.get("spec") or {}).get("jobDir") or f"{DEFAULT_JOBS_ROOT}/{name}")
    pod = gang.apply_to_pod(job, pod, role=role)
    return tls_secret.mount(job, pod)  # spec.tls: the job's Secret and FLEXTRAIN_TLS_DIR


def avoid_nodes(pod: dict[str, Any], nodes: Sequence[str]) -> None:
    """Keep ``pod`` off ``nodes`` (a replaced slow worker's node, for a while): a required node-affinity term
    on the node's name, added to each term the user's template has (terms are ORed, so each must say it)."""
    if not nodes:
        return
    ours = {"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}
    affinity = pod["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**t, "matchFields": [*(t.get("matchFields") or ()), ours]} for t in terms]


def job_service(job: Mapping[str, Any], *, service_name: str, role: str, index: int | None,
                port: int) -> dict[str, Any]:
    """A Service of ``job`` selecting its ``role`` pods (only index ``index`` when given)."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    selector = {meta.LABEL_JOB: name, meta.LABEL_ROLE: role}
    if index is not None:
        selector[meta.LABEL_INDEX] = str(index)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name,
            "namespace": namespace,
            "labels": meta.labels(name, role, index),
            "ownerReferences": [meta.owner_reference(job)],
        },
        "spec": {
            "selector": selector,
            "ports": [{"name": "grpc", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def ps_service(job: Mapping[str, Any], *, index: int, port: int | None = None) -> dict[str, Any]:
    """The Service ``<job>-ps-<i>``: the stable address of parameter server ``i`` across relaunches
    (port: :func:`ps_port` unless given)."""
    return job_service(job, service_name=meta.ps_service_name(job["metadata"]["name"], index),
                       role="ps", index=index, port=ps_port(job, index) if port is None else port)


def service_address(service: Mapping[str, Any], *, default_port: int) -> str:
    """``host:port`` of a Service: its clusterIP when it has one, else its DNS name."""
    md, spec = service["metadata"], service.get("spec") or {}
    ports = spec.get("ports") or []
    port = ports[0]["port"] if ports else default_port
    ip = spec.get("clusterIP")
    if ip and ip != "None":
        return f"{ip}:{port}"
    return f"{md['name']}.{md.get('namespace', 'default')}.svc:{port}"


__all__ = ["PodSettings", "instance_pod", "instance_pod_name", "memory_ladder", "ps_port", "pod_settings", "ps_service", "service_address"]
