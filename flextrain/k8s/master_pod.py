"""The master Pod and Service of an ElasticJob, as the operator creates them.

The Service ``<job>-master`` is the master's stable address: workers, the
operator and ``flextrain`` commands in the cluster reach whichever master pod
runs now through it. Master pods are ``<job>-master-<n>``, ``n`` counting
relaunches: a failed master's pod is kept (``kubectl logs`` still works) and
its successor never races it for a name. ``restartPolicy: Never``: the
operator, not the kubelet, relaunches a master, so relaunches are counted
against ``spec.replicaSpecs.master.relaunchBudget`` and recorded as Events.
A master pod runs as its job's own ServiceAccount ``<job>-master``
(:mod:`flextrain.k8s.access`), the one pod of the job with an API token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flextrain.k8s import access, meta
from flextrain.k8s.meta import master_port  # here too: the operator's name for it
from flextrain.k8s.pods import job_pod, job_service

ROLE = "master"


def master_pod_name(job_name: str, index: int) -> str:
    return meta.pod_name(job_name, ROLE, index)


def master_service(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Service ``<job>-master`` selecting whichever master pod of the job runs; with metrics on, a second
    port named ``metrics`` and the scrape annotations (``kubectl port-forward svc/<job>-master 9464``)."""
    service = job_service(job, service_name=meta.master_service_name(job["metadata"]["name"]), role=ROLE,
                          index=None, port=master_port(job))
    if (port := meta.metrics_port(job)) is not None:
        service["spec"]["ports"].append({"name": "metrics", "port": port, "targetPort": port, "protocol": "TCP"})
        service["metadata"]["annotations"] = meta.scrape_annotations(port)
    return service


def master_pod(job: Mapping[str, Any], *, index: int) -> dict[str, Any]:
    """The ``index``-th master pod of ``job`` (0 for the first, n after n relaunches)."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    port = master_port(job)
    pod = master_pod_name(name, index)
    body = job_pod(job, role=ROLE, index=index, pod_name=pod, instance_id=pod,
                   args=[ROLE, "--job", name, "--namespace", namespace, "--port", str(port)],
                   env={"PYTHONUNBUFFERED": "1"}, master_address=meta.master_address(name, namespace, port),
                   port=port, service_account=access.master_account_name(name))
    if (metrics := meta.metrics_port(job)) is not None:
        # (the scrape annotations are on the Service only: on both, Prometheus would scrape the job twice)
        body["spec"]["containers"][0]["ports"].append({"name": "metrics", "containerPort": metrics, "protocol": "TCP"})
    return body


__all__ = ["master_pod", "master_pod_name", "master_port", "master_service"]
