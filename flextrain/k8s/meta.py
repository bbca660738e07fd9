"""Names, labels and owner references: the one vocabulary of flextrain's Kubernetes objects.

Everything flextrain creates carries the same labels (so ``kubectl get pods
-l flextrain.dev/job=NAME`` finds a job's pods) and an ownerReference to its
ElasticJob (so deleting the job garbage-collects them).
"""

from __future__ import annotations

import datetime
import os
import socket
import uuid
from typing import Any, Mapping

GROUP = "flextrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ElasticJob"
PLURAL = "elasticjobs"
SINGULAR = "elasticjob"
SHORT_NAME = "ej"

LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"  # master | worker | ps
LABEL_INDEX = f"{GROUP}/index"
# "true" on a spare worker's pod (--spare-workers: started ahead, parked); the master sets it to "false"
# when it takes the spare (a scale-up or a replacement): `kubectl get pods -l flextrain.dev/spare=true`.
LABEL_SPARE = f"{GROUP}/spare"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"

MASTER_PORT = 50051
PS_PORT = 50061

# The ServiceAccount of every job pod (master, worker, ps): it may manage pods and
# services of its namespace and patch its own ElasticJob's status.
JOB_SERVICE_ACCOUNT = "flextrain-job"
# An ElasticJob annotation choosing its master's port (default MASTER_PORT): for
# clusters with port policies, and for tests where every "pod" shares one host.
ANNOTATION_MASTER_PORT = f"{GROUP}/master-port"
# An ElasticJob annotation BASE: parameter server i listens on BASE + i (and its Service
# exposes that port) instead of every PS on PS_PORT in its own pod: for tests where
# every "pod" shares one host, or clusters whose pods share a network namespace.
ANNOTATION_PS_PORT_BASE = f"{GROUP}/ps-port-base"
# Set on an ElasticJob (value: the reason) to stop it; the operator relays it to the master.
ANNOTATION_STOP = f"{GROUP}/stop"

# Environment of every pod flextrain creates: who it is and where its master is.
ENV_NAMESPACE = "FLEXTRAIN_NAMESPACE"
ENV_JOB_NAME = "FLEXTRAIN_JOB_NAME"
ENV_MASTER_ADDR = "FLEXTRAIN_MASTER_ADDR"
ENV_ROLE = "FLEXTRAIN_ROLE"
ENV_INSTANCE_ID = "FLEXTRAIN_INSTANCE_ID"
ENV_POD_IP = "FLEXTRAIN_POD_IP"  # from the downward API (status.podIP): where a pod's servers listen
ENV_NODE_NAME = "FLEXTRAIN_NODE_NAME"  # from the downward API (spec.nodeName): where a worker runs (--node-check)


def labels(job: str, role: str, index: int | None = None) -> dict[str, str]:
    out = {LABEL_JOB: job, LABEL_ROLE: role, LABEL_MANAGED_BY: "flextrain"}
    if index is not None:
        out[LABEL_INDEX] = str(index)
    return out


def selector(job: str, role: str | None = None) -> str:
    """A label selector string for a job's objects (optionally one role)."""
    parts = [f"{LABEL_JOB}={job}"]
    if role:
        parts.append(f"{LABEL_ROLE}={role}")
    return ",".join(parts)


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to the ElasticJob ``job`` (a dict with ``metadata``).

    ``controller`` is set so that exactly one owner manages the object and
    ``blockOwnerDeletion`` so that foreground deletion of the job waits for it.
    """
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def master_service_name(job: str) -> str:
    return f"{job}-master"


def master_address(job: str, namespace: str, port: int = MASTER_PORT) -> str:
    """The in-cluster gRPC address of a job's master (its Service)."""
    return f"{master_service_name(job)}.{namespace}.svc:{port}"


METRICS_PORT = 9464  # the master's Prometheus port unless spec.metricsPort says otherwise (0: this one)


def metrics_port(job: Mapping[str, Any]) -> int | None:
    """The port the job's master serves Prometheus metrics on; None: ``spec.metrics: false``."""
    spec = job.get("spec") or {}
    if spec.get("metrics") is False:
        return None
    return spec.get("metricsPort") or METRICS_PORT


def scrape_annotations(port: int) -> dict[str, str]:
    """The ``prometheus.io/*`` annotations most Prometheus setups discover scrape targets by."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def master_port(job: Mapping[str, Any]) -> int:
    """The port the job's master listens on (annotation ``flextrain.dev/master-port``, else 50051)."""
    raw = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_MASTER_PORT)
    if raw is None:
        return MASTER_PORT
    try:
        port = int(raw)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise ValueError(f"metadata.annotations[{ANNOTATION_MASTER_PORT}]: not a port number: {raw!r}")
    return port


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role}-{index}"


def ps_service_name(job: str, index: int) -> str:
    return f"{job}-ps-{index}"


def current_namespace(default: str = "default") -> str:
    """The namespace this process runs in: env, then the service-account file, then ``default``."""
    if ns := os.environ.get(ENV_NAMESPACE):
        return ns
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or default
    except OSError:
        return default


def load_client_config() -> None:
    """Configure the ``kubernetes`` client: in-cluster when in a pod, else kubeconfig."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def now_iso() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, ``Z``)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def job_event(job: Mapping[str, Any], *, reason: str, message: str, warning: bool, component: str,
              key: str | None = None) -> dict[str, Any]:
    """A core/v1 Event about the ElasticJob ``job`` (``kubectl describe ej/NAME`` lists it), recorded
    by ``component`` (``operator`` or ``master``).

    Its name is random, or with ``key`` ``JOB.KEY.UID8``: the API server refuses a second Event
    of that name, so an action keyed so is recorded once however often it is reported.
    """
    md = job["metadata"]
    stamp = now_iso()
    suffix = f"{key}.{(md.get('uid') or '')[:8]}" if key else uuid.uuid4().hex[:12]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{md['name']}.{suffix}", "namespace": md["namespace"],
                     "labels": {LABEL_JOB: md["name"]}},
        "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": md["name"],
                           "namespace": md["namespace"], "uid": md.get("uid")},
        "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": f"flextrain-{component}"}, "reportingComponent": f"{GROUP}/{component}",
        "reportingInstance": socket.gethostname(),
    }
