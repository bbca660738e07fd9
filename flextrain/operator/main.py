"""Running the operator: ``flextrain operator [--namespace NS ... | --all-namespaces]``.

kopf runs standalone (one operator replica; no peering objects), logs in with
the same credentials as the ``kubernetes`` client it hands to the handlers
(in-cluster ServiceAccount, else kubeconfig), and posts no Events of its own:
the handlers record the ones users need (``kubectl describe ej/NAME``).
CRD scanning is off: the ElasticJob CRD must be installed before the
operator starts (the chart and ``manifests/`` install it first).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Collection
from typing import Any

import kopf

from flextrain.operator import lifecycle
from flextrain.operator.handlers import build_registry
from flextrain.operator.kube import Kube
from flextrain.operator.metrics import OperatorMetrics
from flextrain.operator.reconcile import TERMINAL, Reconciler

log = logging.getLogger(__name__)


def connection_info(api_client) -> kopf.ConnectionInfo:
    """kopf's login from a configured ``kubernetes`` ApiClient (one set of credentials for both)."""
    cfg = api_client.configuration
    auth = cfg.get_api_key_with_prefix("authorization") or ""  # runs the in-cluster token refresh hook
    token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else (auth or None)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert or None,
        insecure=not cfg.verify_ssl,
        token=token,
        username=cfg.username or None,
        password=cfg.password or None,
        certificate_path=cfg.cert_file or None,
        private_key_path=cfg.key_file or None,
    )


def settings(*, worker_threads: int = 8) -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.peering.standalone = True
    s.posting.enabled = False  # our handlers record the Events that matter
    s.scanning.disabled = True
    s.execution.max_workers = worker_threads
    s.persistence.finalizer = "operator.flextrain.dev/finalizer"  # unused: no deletion handlers, no timers
    return s


class Sweeper:
    """Every ``interval`` s: each live job's master checked, its worker count and stop request synced; every
    job's lifetime (``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``: flextrain.operator.lifecycle) kept.

    The level-triggered backstop of the event handlers (a pod death or scale
    missed while the operator was down or busy). A plain thread rather than a
    kopf timer, which would put a finalizer on every ElasticJob.
    """

    def __init__(self, reconciler: Reconciler, *, namespaces: Collection[str], clusterwide: bool,
                 interval: float) -> None:
        self.reconciler, self.namespaces, self.clusterwide = reconciler, list(namespaces), clusterwide
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="flextrain-operator-sweep")

    def start(self) -> Sweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _jobs(self) -> list[dict]:
        from flextrain.k8s import meta

        custom = self.reconciler.kube.custom
        if self.clusterwide:
            return custom.list_cluster_custom_object(meta.GROUP, meta.VERSION, meta.PLURAL).get("items", [])
        return [job for ns in self.namespaces
                for job in custom.list_namespaced_custom_object(meta.GROUP, meta.VERSION, ns, meta.PLURAL)
                .get("items", [])]

    def sweep(self) -> None:
        kube = self.reconciler.kube
        jobs = self._jobs()
        self.reconciler.metrics.swept(jobs)
        for job in jobs:
            try:  # lifecycle first: a job past its deadline is failed, not relaunched or scaled
                if lifecycle.collect_finished(kube, job) or lifecycle.enforce_deadline(kube, job):
                    continue
            except Exception as exc:  # noqa: BLE001 - one job's trouble must not stop the others' checks
                self.reconciler.metrics.reconcile_errors.inc()
                md = job.get("metadata") or {}
                log.warning("lifecycle of %s/%s failed: %s", md.get("namespace"), md.get("name"), exc)
            if ((job.get("status") or {}).get("phase")) in TERMINAL:
                continue
            try:
                self.reconciler.ensure(job)
                self.reconciler.sync_replicas(job)
                self.reconciler.sync_stop(job)
            except Exception as exc:  # noqa: BLE001 - one job's trouble must not stop the others' checks
                self.reconciler.metrics.reconcile_errors.inc()
                md = job.get("metadata") or {}
                log.warning("sweep of %s/%s failed: %s", md.get("namespace"), md.get("name"), exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception as exc:  # noqa: BLE001 - API server unreachable: try again next time
                log.warning("operator sweep failed: %s", exc)


def build(api_client, *, default_scheduling: dict | None = None, metrics: OperatorMetrics | None = None,
          network_policies_from: str | None = None) -> tuple[kopf.OperatorRegistry, Reconciler]:
    reconciler = Reconciler(Kube(api_client), default_scheduling=default_scheduling, metrics=metrics,
                            network_policies_from=network_policies_from)
    registry = build_registry(reconciler)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(api_client)

    return registry, reconciler


def run_operator(api_client, *, namespaces: Collection[str] = (), clusterwide: bool = False,
                 stop_flag: threading.Event | None = None, ready_flag: threading.Event | None = None,
                 sweep_interval: float = 15.0, default_scheduling: dict | None = None,
                 metrics_port: int | None = None, metrics: OperatorMetrics | None = None,
                 network_policies_from: str | None = None) -> None:
    """Run the operator until ``stop_flag`` is set (or a signal, when in the main thread).

    ``default_scheduling`` (``{"gang": ..., "queue": ...}``) is written into every job that sets no
    ``spec.scheduling`` before it starts (:func:`flextrain.operator.admission.with_default_scheduling`).
    With ``metrics_port`` (0: a free one) it serves its Prometheus metrics (``metrics``, else its own) there.
    With ``network_policies_from`` (the namespace the operator's pod runs in) every job gets NetworkPolicies
    (:mod:`flextrain.k8s.netpol`) admitting that namespace's operator pod to its master.
    """
    if clusterwide == bool(namespaces):
        raise ValueError("give either namespaces or clusterwide=True")
    registry, reconciler = build(api_client, default_scheduling=default_scheduling, metrics=metrics,
                                 network_policies_from=network_policies_from)
    if metrics_port is not None:
        log.info("operator metrics at http://0.0.0.0:%d/metrics", reconciler.metrics.serve(port=metrics_port))
    log.info("flextrain operator watching %s", "all namespaces" if clusterwide else ", ".join(namespaces))
    sweeper = Sweeper(reconciler, namespaces=namespaces, clusterwide=clusterwide, interval=sweep_interval).start()
    try:
        asyncio.run(kopf.operator(
            registry=registry, settings=settings(), standalone=True, clusterwide=clusterwide,
            namespaces=list(namespaces), stop_flag=stop_flag, ready_flag=ready_flag,
        ))
    finally:
        sweeper.stop()
        reconciler.metrics.close()


__all__ = ["build", "connection_info", "run_operator", "settings"]
