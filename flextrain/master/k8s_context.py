"""The master's Kubernetes context: its ElasticJob, its Service's address, and the pod backend built on them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flextrain.job import JobSpec
from flextrain.k8s import meta
from flextrain.k8s.pods import service_address
from flextrain.master.k8s_backend import KubernetesPodBackend
from flextrain.master.k8s_create import LaunchError


@dataclass(frozen=True)
class KubernetesContext:
    """What ``run_master`` needs to run a job's instances as Pods."""

    backend: KubernetesPodBackend
    job: Mapping[str, Any]  # the ElasticJob as read at start
    master_address: str  # what workers dial: the master Service
    api_client: Any


def kubernetes_context(spec: JobSpec, *, namespace: str | None = None, api_client=None,
                       on_fatal: Callable[[str], None] = lambda message: None,
                       on_note: Callable[[str], None] = lambda message: None,
                       keep_failed: Callable[[], Iterable[str]] = lambda: ()) -> KubernetesContext:
    """Read the job's ElasticJob and master Service and build its pod backend (callbacks: see
    :class:`KubernetesPodBackend`).

    ``api_client`` defaults to in-cluster config (else kubeconfig); ``namespace``
    to the pod's own. Raises LaunchError naming what is missing.
    """
    from kubernetes import client
    from kubernetes.client import ApiException

    if api_client is None:
        meta.load_client_config()
        api_client = client.ApiClient()
    namespace = namespace or meta.current_namespace()
    try:
        job = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, meta.PLURAL, spec.name)
    except ApiException as exc:
        raise LaunchError(f"ElasticJob {namespace}/{spec.name}: cannot read it: {exc.status} {exc.reason}") from None
    service = meta.master_service_name(spec.name)
    try:
        svc = client.CoreV1Api(api_client).read_namespaced_service(service, namespace, _preload_content=False)
    except ApiException as exc:
        raise LaunchError(f"Service {namespace}/{service} (the master's address for workers): "
                          f"{exc.status} {exc.reason}; the operator creates it with the master pod") from None
    address = service_address(json.loads(svc.data), default_port=meta.MASTER_PORT)
    backend = KubernetesPodBackend(api_client, job=job, master_address=address, on_fatal=on_fatal,
                                   on_note=on_note, keep_failed=keep_failed)
    return KubernetesContext(backend=backend, job=job, master_address=address, api_client=api_client)


__all__ = ["KubernetesContext", "kubernetes_context"]
