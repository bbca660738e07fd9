"""The operator's kopf handlers, registered on a registry of their own.

Each handler is thin: it reads the job fresh where a decision depends on it
and calls the :class:`~flextrain.operator.reconcile.Reconciler`. Handlers are
synchronous (the ``kubernetes`` client and gRPC block), so kopf runs them in
its thread pool.

* ElasticJob created -> validate; Failed + Warning Event, or master Service + Pod.
* ElasticJob resumed (operator restarted) -> the same level-triggered check, so a
  master lost while nobody watched is relaunched (``main.Sweeper`` repeats it
  periodically; kopf's timers would put a finalizer on every job).
* A master pod of a job changes or disappears -> check that job's master now.
* ``spec.replicaSpecs.worker.replicas`` changed (``kubectl scale``) -> Scale RPC, or the
  spec reverted when the count is out of range or the job has finished (one Event either way).
* ``spec.suspend`` set to false -> the same check: a job waiting for admission starts
  (``operator.admission``).
* annotation ``flextrain.dev/stop`` set (``flextrain stop``) -> Stop RPC.
* ``spec.suspend`` flipped on a running job (``flextrain suspend/resume``, Kueue) -> Suspend RPC.
* ``status.phase`` changed -> one Event per phase entered, those passed unseen included.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from flextrain.k8s import meta
from flextrain.operator.reconcile import MasterUnreachable, Reconciler
from flextrain.operator.suspending import relay_suspend_change

log = logging.getLogger(__name__)

RELAY_RETRY_DELAY = 5.0  # seconds before kopf retries a relay the master did not answer
RELAY_RETRIES = 60


def build_registry(reconciler: Reconciler, *, registry: kopf.OperatorRegistry | None = None
                   ) -> kopf.OperatorRegistry:
    """A kopf registry with every handler of the operator bound to ``reconciler``."""
    registry = registry or kopf.OperatorRegistry()
    job_resource = {"group": meta.GROUP, "version": meta.VERSION, "plural": meta.PLURAL, "registry": registry}
    counted = reconciler.metrics.counted  # every handler's exceptions: flextrain_operator_reconcile_errors_total

    # No return values: kopf would store them in the job's status.
    @kopf.on.create(**job_resource, id="create")
    @counted
    def on_create(body: kopf.Body, **_: Any) -> None:
        reconciler.ensure(_plain(body))

    @kopf.on.resume(**job_resource, id="resume")
    @counted
    def on_resume(body: kopf.Body, **_: Any) -> None:
        reconciler.ensure(_plain(body))

    @kopf.on.event("", "v1", "pods", registry=registry, id="master-pod",
                   labels={meta.LABEL_ROLE: "master", meta.LABEL_MANAGED_BY: "flextrain"})
    @counted
    def on_master_pod(type: str | None, body: kopf.Body, **_: Any) -> None:
        phase = (body.get("status") or {}).get("phase")
        if type != "DELETED" and phase not in ("Failed", "Succeeded"):
            return  # a running or pending master needs nothing
        job_name = body.metadata.labels.get(meta.LABEL_JOB)
        job = reconciler.kube.get_job(body.metadata.namespace, job_name) if job_name else None
        if job is not None:
            outcome = reconciler.ensure(job)
            log.info("master pod %s %s (phase %s): job %s %s", body.metadata.name, type, phase, job_name,
                     outcome.value)

    @kopf.on.field(**job_resource, id="suspend", field="spec.suspend")
    @counted
    def on_unsuspended(new: Any, body: kopf.Body, **_: Any) -> None:
        if not new:  # admitted (Kueue) or resumed by hand: a job that never started starts now
            job = reconciler.kube.get_job(body.metadata.namespace, body.metadata.name)
            if job is not None:
                reconciler.ensure(job)

    @kopf.on.field(**job_resource, id="relay-replicas", field="spec.replicaSpecs.worker.replicas",
                   retries=RELAY_RETRIES)
    @counted
    def on_replicas(old: Any, new: Any, body: kopf.Body, **_: Any) -> None:
        try:
            reconciler.scale(_plain(body), old=old, new=new)  # reads the job fresh itself
        except MasterUnreachable as exc:
            raise kopf.TemporaryError(str(exc), delay=RELAY_RETRY_DELAY) from exc

    @kopf.on.field(**job_resource, id="relay-stop", field=["metadata", "annotations", meta.ANNOTATION_STOP],
                   retries=RELAY_RETRIES)
    @counted
    def on_stop(new: Any, body: kopf.Body, **_: Any) -> None:
        if not new:
            return
        job = reconciler.kube.get_job(body.metadata.namespace, body.metadata.name)
        if job is None:
            return
        try:
            reconciler.stop(job, reason=str(new))
        except MasterUnreachable as exc:
            raise kopf.TemporaryError(str(exc), delay=RELAY_RETRY_DELAY) from exc

    @kopf.on.field(**job_resource, id="relay-suspend", field="spec.suspend", retries=RELAY_RETRIES)
    @counted
    def on_suspend_relayed(old: Any, new: Any, body: kopf.Body, **_: Any) -> None:
        job = reconciler.kube.get_job(body.metadata.namespace, body.metadata.name)
        if job is None:
            return
        try:
            relay_suspend_change(reconciler.kube, job, target=reconciler.master_address(job), old=old, new=new)
        except MasterUnreachable as exc:
            raise kopf.TemporaryError(str(exc), delay=RELAY_RETRY_DELAY) from exc

    @kopf.on.field(**job_resource, id="phase-events", field="status.phase")
    @counted
    def on_phase(old: Any, new: Any, body: kopf.Body, **_: Any) -> None:
        if new and new != old:
            reconciler.phase_changed(_plain(body), old=old, new=new)

    return registry


def _plain(body: kopf.Body) -> dict:
    """A deep plain-dict copy of a kopf body (builders and the JobSpec mapping take dicts)."""
    import copy

    return copy.deepcopy(dict(body))


__all__ = ["build_registry"]
