"""What the operator does for one ElasticJob, independent of kopf.

State lives in the cluster, never in this process, so any handler may run
again (after an operator restart, a retry, or a pod event racing a timer):

* master pods are ``<job>-master-<n>``; ``n`` is the number of relaunches so
  far, kept in ``status.masterRelaunches`` and recoverable from the pods;
* a pod is only ever created under its deterministic name, so a second
  attempt gets "already exists" and does nothing (and records no Event);
* before relaunching, the job is read again: a master that concluded the job
  writes the terminal phase before it exits, so a dead master of a finished
  job is never relaunched; nor is one whose spec has become invalid (the job
  fails naming the field instead);
* a create the API server refuses is never retried in a tight loop: a
  permanent refusal (Invalid, a PodSecurity or admission Forbidden) fails the
  job naming the object and the API server's reason; a retryable one (quota,
  throttling) keeps it Pending with a Warning Event and a truthful message,
  and is retried with exponential backoff (``RETRY_FIRST`` doubling up to
  ``RETRY_CAP`` seconds); the status says "created" only once it was;
* a status patch the API server refuses (a webhook, the CRD's schema,
  throttling) cannot report itself in the status: a Warning Event
  ``StatusRefused`` says what was refused and why (once per reason), an Event
  the failure was about is recorded all the same, and the job is checked again
  after the same backoff;
* phase Events have deterministic names, so each is recorded once.

What this process remembers only keeps one action to one Event when a handler
and the sweep race (stops and scales relayed, scales reverted); an operator
restart forgets it at the cost of at most one repeated relay.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from flextrain.k8s import meta, tls_secret
from flextrain.k8s.job_status import observed_generation
from flextrain.k8s.meta import now_iso
from flextrain.k8s.master_pod import (
    master_pod,
    master_pod_name,
    master_service,
)
from flextrain.k8s.resource import (
    jobspec_from_resource,
    master_relaunch_budget,
)
from flextrain.operator import admission
from flextrain.operator.access import JobAccess
from flextrain.operator.credentials import ensure_secret, master_credentials
from flextrain.operator.metrics import OperatorMetrics
from flextrain.operator.jobview import TERMINAL, ident, phase_of, spec_problems
from flextrain.k8s.refusals import Refusal, Refused, refusal_of
from flextrain.operator.kube import Kube, master_failure, pod_failure
from flextrain.operator.lifecycle import fail_job
from flextrain.operator.phases import phases_entered
from flextrain.operator.relay import (
    MasterUnreachable,
    Reply,
    Target,
    master_target,
    relay_stop,
)
from flextrain.operator.scaling import ReplicaSettler

log = logging.getLogger(__name__)

RETRY_FIRST = 2.0  # seconds before the first retry of a refused create
RETRY_CAP = 60.0  # the longest wait between two tries


class Outcome(str, enum.Enum):
    """What one reconciliation did (logged; asserted by tests)."""

    CREATED = "created"
    RUNNING = "running"
    RELAUNCHED = "relaunched"
    FAILED = "failed"
    INVALID = "invalid"
    OVER = "over"
    DELETING = "deleting"
    MASTER_DONE = "master-done"
    REFUSED = "refused"  # the API server refused the master's pod or Service: job Failed
    WAITING = "waiting"  # ... for now (quota, throttling): retried after a backoff
    STATUS_REFUSED = "status-refused"  # a patch of the job's status was refused: Warning Event, backoff
    ADMISSION = "admission"  # suspended, or its gang not admitted yet: Pending with the reason, no master


@dataclass
class _Backoff:
    """A job whose master objects the API server refused for now."""

    tries: int
    next_try: float  # time.monotonic()
    told: str  # the refusal last reported in an Event (reported again only when it changes)


class Reconciler:
    def __init__(self, kube: Kube, *, default_scheduling: dict | None = None,
                 metrics: OperatorMetrics | None = None, network_policies_from: str | None = None) -> None:
        self.kube = kube
        # the master's ServiceAccount/Role/RoleBinding; NetworkPolicies admitting the operator's namespace
        self.access = JobAccess(kube, operator_namespace=network_policies_from)
        self.default_scheduling = default_scheduling  # for jobs without spec.scheduling (the chart's value)
        self.metrics = metrics or OperatorMetrics()
        self.replicas = ReplicaSettler(kube, target=self._target)
        self._backoff: dict[str, _Backoff] = {}  # job uid -> its refused master objects' next try
        self._stops_sent: set[tuple[Any, ...]] = set()  # (job uid, master relaunches, reason) sent
        self._lock = threading.Lock()

    # ---- lifecycle -----------------------------------------------------------------
    def fail(self, job: dict, *, reason: str, message: str, failure: dict | None = None) -> None:
        """Record a Warning Event and fail the job as every failure does (:func:`~flextrain.operator.lifecycle.
        fail_job`: condition ``Failed`` with ``reason``, ``failure``, its worker and PS pods deleted). The
        Event first: whoever sees the phase Failed finds the Event that says why (and it is there even if
        the status is refused)."""
        # keyed: a job fails once, however often a refused status makes this run again
        self.kube.event(job, reason=reason, message=message, warning=True, key="failed")
        fail_job(self.kube, job, reason=reason, message=message, failure=failure)

    def ensure(self, job: dict) -> Outcome:
        """Bring the job's master to where it should be: created, running, or relaunched."""
        namespace, name = ident(job)
        if job["metadata"].get("deletionTimestamp"):
            return Outcome.DELETING
        if phase_of(job) in TERMINAL:
            return Outcome.OVER
        backoff = self._backoff.get(job["metadata"].get("uid"))
        if backoff is not None and time.monotonic() < backoff.next_try:
            return Outcome.WAITING
        try:
            outcome = self._ensure(job)
        except Refused as refused:
            try:
                return self._on_refusal(job, refused.refusal)
            except Refused as again:  # the status that would have said so was refused too
                return self._on_refusal(job, again.refusal)
        self._backoff.pop(job["metadata"].get("uid"), None)
        return outcome

    def _ensure(self, job: dict) -> Outcome:
        namespace, name = ident(job)
        pods = self.kube.master_pods(namespace, name)
        relaunches = (job.get("status") or {}).get("masterRelaunches")
        if relaunches is None and not pods:
            # An invalid spec fails at once (in _create) rather than wait for an admission it cannot use.
            job = admission.with_default_scheduling(self.kube, job, self.default_scheduling)
            waiting = admission.waiting_for(self.kube, job) if spec_problems(job) is None else None
            if waiting is not None:
                admission.hold(self.kube, job, reason=waiting[0], message=waiting[1])
                return Outcome.ADMISSION
            return self._create(job)
        if relaunches is None and list(pods) == [0]:  # created, but its status was not written (refused)
            self._mark_created(job)
        self._create_object(f'service "{meta.master_service_name(name)}"',  # idempotent; heals a deleted one
                            lambda: self.kube.create_service(master_service(job)))
        current = max([relaunches or 0, *pods])
        if relaunches != current:
            self.kube.patch_status(job, {"masterRelaunches": current})
        pod = pods.get(current)
        why = pod_failure(pod)
        if pod is not None and (pod.get("status") or {}).get("phase") == "Succeeded":
            return Outcome.MASTER_DONE  # it wrote the job's final status itself
        if why is None:
            return Outcome.RUNNING
        return self._relaunch(namespace, name, current, why, pod)

    def _create(self, job: dict) -> Outcome:
        problem = spec_problems(job)
        if problem is not None:
            self.fail(job, reason="InvalidSpec", message=problem, failure={"kind": "InvalidSpec", "message": problem})
            return Outcome.INVALID
        namespace, name = ident(job)
        pod, service = master_pod_name(name, 0), meta.master_service_name(name)
        self._ensure_secret(job)  # before any pod that mounts it
        self._create_object(f'service "{service}"', lambda: self.kube.create_service(master_service(job)))
        self.access.ensure(job, self._create_object)
        created = self._create_object(f'pod "{pod}"', lambda: self.kube.create_pod(master_pod(job, index=0)))
        self._backoff.pop(job["metadata"].get("uid"), None)
        if created:  # before the status: a refused status patch must not hide that the pod exists
            self.kube.event(job, reason="MasterCreated", message=f"created master pod {pod} and service {service}")
        self._mark_created(job)
        return Outcome.CREATED

    def _mark_created(self, job: dict) -> None:
        """The status of a job whose first master pod exists (written only once it does)."""
        namespace, name = ident(job)
        replicas = jobspec_from_resource(job).worker.replicas
        fresh = self.kube.get_job(namespace, name) or job
        status: dict[str, Any] = {"masterRelaunches": 0, "selector": meta.selector(name, "worker"),
                                  **observed_generation(fresh)}
        if not (fresh.get("status") or {}).get("startTime"):  # a master that ended the job wrote one, not later
            status["startTime"] = now_iso()                  # than its completionTime: keep that
        # A master that started fast may have written its own phase meanwhile; only a job still
        # Pending (or without status) gets the operator's.
        if phase_of(fresh) in (None, "Pending"):
            status.update(phase="Pending", message=f"master pod {master_pod_name(name, 0)} created",
                          workers={"desired": replicas, "active": 0, "summary": f"0/{replicas}"})
            if (job.get("status") or {}).get("conditions"):  # it waited for admission (flextrain.operator.admission)
                status["conditions"] = [admission.admitted_condition(True, reason="Admitted")]
        self.kube.patch_status(job, status)

    def _ensure_secret(self, job: dict) -> None:
        """spec.tls: the job's TLS Secret (flextrain/operator/credentials.py); a refusal as for the pod."""
        self._create_object(f'secret "{tls_secret.secret_name(job["metadata"]["name"])}"',
                            lambda: ensure_secret(self.kube, job))

    def _create_object(self, what: str, create) -> bool:
        """``create()``; the API server's refusal (or silence) becomes :class:`Refused` naming ``what``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return create()
        except (ApiException, HTTPError, OSError) as exc:
            raise Refused(refusal_of(exc, what=what)) from exc

    def _on_refusal(self, job: dict, why: Refusal) -> Outcome:
        """Fail the job for a permanent refusal; wait (backoff, one Event per new reason) for a retryable
        one or for a refused status patch."""
        uid = job["metadata"].get("uid")
        if not why.retryable and why.action != "patch":
            self._backoff.pop(uid, None)
            self.fail(job, reason="MasterRefused", message=why.message(),
                      failure={"kind": "MasterRefused", "message": why.message()})
            return Outcome.REFUSED
        previous = self._backoff.get(uid)
        tries = previous.tries + 1 if previous else 1
        delay = min(RETRY_CAP, RETRY_FIRST * 2 ** (tries - 1))
        self._backoff[uid] = _Backoff(tries, time.monotonic() + delay, why.text)
        if why.action == "patch":
            message = f"{why.message()} (try {tries}; the operator checks the job again in {delay:.0f}s)"
            if previous is None or previous.told != why.text:
                self.kube.event(job, reason="StatusRefused", message=message, warning=True)
            log.warning("%s/%s: %s", *ident(job), message)
            return Outcome.STATUS_REFUSED
        message = f"{why.message()} (to create {why.what}; try {tries}, next in {delay:.0f}s)"
        status = {"message": message, **observed_generation(job)}
        if phase_of(job) is None:
            status["phase"] = "Pending"
        self.kube.patch_status(job, status)
        if previous is None or previous.told != why.text:
            self.kube.event(job, reason="MasterPending", message=message, warning=True)
        log.info("%s/%s: %s", *ident(job), message)
        return Outcome.WAITING

    def _relaunch(self, namespace: str, name: str, current: int, why: str, pod: dict | None) -> Outcome:
        job = self.kube.get_job(namespace, name)  # fresh: did the master conclude the job before dying?
        if job is None or job["metadata"].get("deletionTimestamp"):
            return Outcome.DELETING
        if phase_of(job) in TERMINAL:
            return Outcome.OVER
        old = master_pod_name(name, current)
        problem = spec_problems(job)
        if problem is not None:  # a new master would exit at once on this spec (exit code 2): say why
            message = f"{problem} (master pod {old} {why}; not relaunched)"
            self.fail(job, reason="InvalidSpec", message=message, failure={"kind": "InvalidSpec", "message": problem})
            return Outcome.INVALID
        budget, field = master_relaunch_budget(job)
        if current >= budget:
            self.fail(job, reason="BackoffLimitExceeded" if field == "spec.backoffLimit" else "MasterFailed",
                      message=f"master pod {old} {why}; relaunch budget ({field} = {budget}) used up",
                      failure=master_failure(pod, old, why))
            return Outcome.FAILED
        new = master_pod_name(name, current + 1)
        self._ensure_secret(job)  # kept as it is when it exists (the running pods hold its token)
        self.access.ensure(job, self._create_object)  # heals what was deleted since
        created = self._create_object(f'pod "{new}"', lambda: self.kube.create_pod(master_pod(job, index=current + 1)))
        self._backoff.pop(job["metadata"].get("uid"), None)
        message = (f"master pod {old} {why}: relaunched as {new} ({current + 1}/{budget}); "
                   "it resumes from the job's latest checkpoint")
        self.kube.patch_status(job, {"masterRelaunches": current + 1, "message": message, **observed_generation(job)})
        if created:
            self.kube.event(job, reason="MasterRelaunched", message=message, warning=True)
            self.metrics.master_relaunches.inc()
        return Outcome.RELAUNCHED

    # ---- relays to the master ------------------------------------------------------
    def master_address(self, job: dict) -> Target:
        """The gRPC address of ``job``'s master (through its Service), with the job's TLS material."""
        return self._target(job)

    def _target(self, job: dict) -> Target:
        namespace, name = ident(job)
        address = master_target(self.kube.get_service(namespace, meta.master_service_name(name)),
                                job=name, namespace=namespace)
        return Target(address, master_credentials(self.kube, job))

    def scale(self, job: dict, *, old: Any, new: Any) -> Reply | None:
        """Edge-triggered: ``spec.replicaSpecs.worker.replicas`` went ``old`` -> ``new`` (see
        :meth:`~flextrain.operator.scaling.ReplicaSettler.scale`)."""
        return self.replicas.scale(job, old=old, new=new)

    def sync_replicas(self, job: dict) -> Reply | None:
        """Level-triggered (the sweep; see :meth:`~flextrain.operator.scaling.ReplicaSettler.sync`)."""
        return self.replicas.sync(job)

    def sync_stop(self, job: dict) -> Reply | None:
        """Level-triggered stop: each running master of a job with ``flextrain.dev/stop`` is told once.

        Covers a master relaunched after the stop was relayed to its predecessor.
        """
        reason = (job["metadata"].get("annotations") or {}).get(meta.ANNOTATION_STOP)
        if not reason or phase_of(job) != "Running":
            return None
        return self.stop(job, reason=reason)

    def stop(self, job: dict, *, reason: str) -> Reply | None:
        """Relay a stop request (the ``flextrain.dev/stop`` annotation) to the master, once per master.

        The handler and the sweep may race; a (job, master relaunch, reason) key
        taken under a lock lets exactly one of them send it.
        """
        if phase_of(job) in TERMINAL:
            return None
        key = (job["metadata"].get("uid"), (job.get("status") or {}).get("masterRelaunches"), reason)
        with self._lock:
            if key in self._stops_sent:
                return None
            self._stops_sent.add(key)
        try:
            reply = relay_stop(self._target(job), reason)
        except BaseException:
            with self._lock:
                self._stops_sent.discard(key)  # not delivered: the next attempt may send it
            raise
        self.kube.event(job, reason="StopRequested" if reply.accepted else "StopRejected",
                        message=f"{reason}: {reply.message}", warning=not reply.accepted)
        return reply

    def phase_changed(self, job: dict, *, old: str | None, new: str) -> None:
        """Record one Event per phase the job entered since ``old`` (Warning when it failed).

        Phases the operator did not see (a quick job) are filled in from the
        status (:func:`~flextrain.operator.phases.phases_entered`). Each Event is
        keyed by job and phase, so a phase is reported once however often this
        runs (handler retries, operator restarts).
        """
        status = job.get("status") or {}
        message = status.get("message") or ""
        for previous, phase, derived in phases_entered(old, new, status):
            text = f"phase {previous or 'None'} -> {phase}"
            if derived:
                text += f" (seen by the operator only as {old or 'None'} -> {new})"
            elif message:
                text += f": {message}"
            self.kube.event(job, reason=f"Job{phase}", message=text, warning=phase == "Failed",
                            key=f"phase-{phase.lower()}")


__all__ = ["TERMINAL", "MasterUnreachable", "Outcome", "Reconciler"]
