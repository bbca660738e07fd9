"""The master Pod and Service of an ElasticJob, as the operator creates them.

The Service ``<job>-master`` is the master's stable address: workers, the
operator and ``flextrain`` commands in the cluster reach whichever master pod
runs now through it. Master pods are ``<job>-master-<n>``, ``n`` counting
relaunches: a failed master's pod is kept (``kubectl logs`` still works) and
its successor never races it for a name. ``restartPolicy: Never``: the
operator, not the kubelet, relaunches a master, so relaunches are counted
against ``spec.replicaSpecs.master.relaunchBudget`` and recorded as Events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flextrain.k8s import meta
from flextrain.k8s.resource import pod_settings

ROLE = "master"


def master_port(job: Mapping[str, Any]) -> int:
    """The port the job's master listens on (annotation ``flextrain.dev/master-port``, else 50051)."""
    raw = ((job.get("metadata") or {}).get("annotations") or {}).get(meta.ANNOTATION_MASTER_PORT)
    if raw is None:
        return meta.MASTER_PORT
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise ValueError(f"metadata.annotations[{meta.ANNOTATION_MASTER_PORT}]: not a port number: {raw!r}")
    return port


def master_pod_name(job_name: str, index: int) -> str:
    return meta.pod_name(job_name, ROLE, index)


def master_service(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Service ``<job>-master`` selecting whichever master pod of the job runs."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    port = master_port(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": meta.master_service_name(name),
            "namespace": namespace,
            "labels": meta.labels(name, ROLE),
            "ownerReferences": [meta.owner_reference(job)],
        },
        "spec": {
            "selector": {meta.LABEL_JOB: name, meta.LABEL_ROLE: ROLE},
            "ports": [{"name": "grpc", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def master_pod(job: Mapping[str, Any], *, index: int) -> dict[str, Any]:
    """The ``index``-th master pod of ``job`` (0 for the first, n after n relaunches)."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    port = master_port(job)
    pod = master_pod_name(name, index)
    settings = pod_settings(job, ROLE)
    ours = [
        {"name": meta.ENV_NAMESPACE, "value": namespace},
        {"name": meta.ENV_JOB_NAME, "value": name},
        {"name": meta.ENV_ROLE, "value": ROLE},
        {"name": meta.ENV_INSTANCE_ID, "value": pod},
        {"name": meta.ENV_MASTER_ADDR, "value": meta.master_address(name, namespace, port)},
        {"name": meta.ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    taken = {e["name"] for e in ours}
    # The pod's identity is ours to set; a user's env may add to it, not change it.
    env = [dict(e) for e in settings.env if e.get("name") not in taken] + ours
    container: dict[str, Any] = {
        "name": ROLE,
        "image": settings.image,
        "command": ["flextrain"],
        "args": [ROLE, "--job", name, "--namespace", namespace, "--port", str(port)],
        "env": env,
        "ports": [{"name": "grpc", "containerPort": port, "protocol": "TCP"}],
    }
    if settings.image_pull_policy:
        container["imagePullPolicy"] = settings.image_pull_policy
    if settings.resources:
        container["resources"] = dict(settings.resources)
    if settings.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in settings.volume_mounts]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": meta.JOB_SERVICE_ACCOUNT,
        "containers": [container],
    }
    if settings.priority_class_name:
        spec["priorityClassName"] = settings.priority_class_name
    if settings.volumes:
        spec["volumes"] = [dict(v) for v in settings.volumes]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod,
            "namespace": namespace,
            "labels": meta.labels(name, ROLE, index),
            "ownerReferences": [meta.owner_reference(job)],
        },
        "spec": spec,
    }


__all__ = ["master_pod", "master_pod_name", "master_port", "master_service"]
