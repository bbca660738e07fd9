"""NetworkPolicies of an ElasticJob: only the job's own pods reach its master and parameter servers.

With ``flextrain operator --network-policies`` (the chart's ``networkPolicies.enabled``, on by
default) the operator creates, owned by the ElasticJob, before its first master pod:

* ``<job>-master`` selecting the job's master pods: every port admits the job's own pods (label
  ``flextrain.dev/job=<job>``): its gRPC port, and the rendezvous TCPStore and a script round's own
  store, which torch serves on ports picked when they start (flextrain/master/stores.py open_store);
  the gRPC port admits the operator's pod too (labels :data:`OPERATOR_LABELS` in the operator's
  namespace: it relays scale and stop requests); with metrics on, the metrics port admits everyone
  (Prometheus runs wherever it runs; the port serves read-only metrics).
* ``<job>-ps`` selecting the job's parameter-server pods (ParameterServer jobs only): their gRPC
  ports admit the job's own pods.

Everything else to those pods is refused, once a policy selects them (where the cluster's network
plugin enforces NetworkPolicies; elsewhere they are inert). Workers are not selected: they accept
what they accepted before (gloo's all-reduce connections between them). Egress is not restricted
(a job reads its data from wherever it is). ``flextrain`` commands outside the cluster reach a job
through the ElasticJob and the operator, never a master's port, so they keep working;
``kubectl port-forward`` to a master connects inside its pod and is not affected either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flextrain.k8s import meta
from flextrain.k8s.pods import ps_port

# The operator pod's labels (charts/flextrain/templates/operator-deployment.yaml sets them).
OPERATOR_LABELS = {"app.kubernetes.io/name": "flextrain", "app.kubernetes.io/component": "operator"}
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server


def _policy(job: Mapping[str, Any], role: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    name = job["metadata"]["name"]
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-{role}", "namespace": job["metadata"]["namespace"],
                     "labels": meta.labels(name, role), "ownerReferences": [meta.owner_reference(job)]},
        "spec": {"podSelector": {"matchLabels": {meta.LABEL_JOB: name, meta.LABEL_ROLE: role}},
                 "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in sorted(set(ports))]


def job_policies(job: Mapping[str, Any], *, operator_namespace: str) -> list[dict[str, Any]]:
    """The NetworkPolicies of ``job`` (an ElasticJob with metadata.uid), as the module says."""
    own_pods = {"podSelector": {"matchLabels": {meta.LABEL_JOB: job["metadata"]["name"]}}}
    operator = {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: operator_namespace}},
                "podSelector": {"matchLabels": dict(OPERATOR_LABELS)}}
    # The job's pods on any port: the stores' ports are only known once they listen (and the store
    # checks no token, so no one else may reach it); the operator on the gRPC port only.
    master = [{"from": [own_pods]}, {"from": [operator], "ports": _tcp(meta.master_port(job))}]
    if (metrics := meta.metrics_port(job)) is not None:
        master.append({"ports": _tcp(metrics)})
    policies = [_policy(job, "master", master)]
    spec = job.get("spec") or {}
    servers = ((spec.get("replicaSpecs") or {}).get("ps") or {}).get("replicas") or 0
    if spec.get("strategy") == "ParameterServer" and servers:
        ports = _tcp(*(ps_port(job, i) for i in range(servers)))
        policies.append(_policy(job, "ps", [{"from": [own_pods], "ports": ports}]))
    return policies


__all__ = ["OPERATOR_LABELS", "job_policies"]
