"""What the operator does for one ElasticJob, independent of kopf.

State lives in the cluster, never in this process, so any handler may run
again (after an operator restart, a retry, or a pod event racing a timer):

* master pods are ``<job>-master-<n>``; ``n`` is the number of relaunches so
  far, kept in ``status.masterRelaunches`` and recoverable from the pods;
* a pod is only ever created under its deterministic name, so a second
  attempt gets "already exists" and does nothing (and records no Event);
* before relaunching, the job is read again: a master that concluded the job
  writes the terminal phase before it exits, so a dead master of a finished
  job is never relaunched;
* a create the API server refuses is never retried in a tight loop: a
  permanent refusal (Invalid, a PodSecurity or admission Forbidden) fails the
  job naming the object and the API server's reason; a retryable one (quota,
  throttling) keeps it Pending with a Warning Event and a truthful message,
  and is retried with exponential backoff (``RETRY_FIRST`` doubling up to
  ``RETRY_CAP`` seconds); the status says "created" only once it was.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from flextrain.k8s import meta
from flextrain.k8s.master_pod import (
    master_pod,
    master_pod_name,
    master_service,
)
from flextrain.k8s.resource import (
    jobspec_from_resource,
    master_relaunch_budget,
    problems,
)
from flextrain.operator.kube import Kube, Refusal, now_iso, pod_failure, refusal
from flextrain.operator.relay import (
    MasterUnreachable,
    Reply,
    master_target,
    relay_scale,
    relay_stop,
)

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
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


@dataclass
class _Backoff:
    """A job whose master objects the API server refused for now."""

    tries: int
    next_try: float  # time.monotonic()
    told: str  # the refusal last reported in an Event (reported again only when it changes)


class _Refused(Exception):
    def __init__(self, what: str, refusal: Refusal) -> None:
        super().__init__(f"{what}: {refusal}")
        self.what, self.refusal = what, refusal


def _phase(job: dict | None) -> str | None:
    return ((job or {}).get("status") or {}).get("phase")


def _ident(job: dict) -> tuple[str, str]:
    md = job["metadata"]
    return md["namespace"], md["name"]


def _validate(job: dict) -> str | None:
    """Every problem of a job's spec, one per line, each starting with its field path; or None."""
    found = problems(job)
    return "\n".join(found) if found else None


class Reconciler:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._refused: dict[str, Any] = {}  # job uid -> replica count refused last
        self._backoff: dict[str, _Backoff] = {}  # job uid -> its refused master objects' next try
        self._stops_sent: set[tuple[Any, ...]] = set()  # (job uid, master relaunches, reason) sent
        self._lock = threading.Lock()

    # ---- lifecycle -----------------------------------------------------------------
    def fail(self, job: dict, *, reason: str, message: str) -> None:
        """Mark the job Failed with ``message`` and record a Warning Event."""
        self.kube.patch_status(job, {"phase": "Failed", "message": message, "completionTime": now_iso()})
        self.kube.event(job, reason=reason, message=message, warning=True)

    def ensure(self, job: dict) -> Outcome:
        """Bring the job's master to where it should be: created, running, or relaunched."""
        namespace, name = _ident(job)
        if job["metadata"].get("deletionTimestamp"):
            return Outcome.DELETING
        if _phase(job) in TERMINAL:
            return Outcome.OVER
        backoff = self._backoff.get(job["metadata"].get("uid"))
        if backoff is not None and time.monotonic() < backoff.next_try:
            return Outcome.WAITING
        try:
            return self._ensure(job)
        except _Refused as refused:
            return self._on_refusal(job, refused)

    def _ensure(self, job: dict) -> Outcome:
        namespace, name = _ident(job)
        pods = self.kube.master_pods(namespace, name)
        relaunches = (job.get("status") or {}).get("masterRelaunches")
        if relaunches is None and not pods:
            return self._create(job)
        self._create_object(f"master service {meta.master_service_name(name)}",  # idempotent; heals a deleted one
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
        return self._relaunch(namespace, name, current, why)

    def _create(self, job: dict) -> Outcome:
        problem = _validate(job)
        if problem is not None:
            self.fail(job, reason="InvalidSpec", message=problem)
            return Outcome.INVALID
        spec = jobspec_from_resource(job)
        namespace, name = _ident(job)
        pod, service = master_pod_name(name, 0), meta.master_service_name(name)
        self._create_object(f"master service {service}", lambda: self.kube.create_service(master_service(job)))
        created = self._create_object(f"master pod {pod}", lambda: self.kube.create_pod(master_pod(job, index=0)))
        self._backoff.pop(job["metadata"].get("uid"), None)
        # Written once the pod exists. A master that started fast may have written its own phase
        # meanwhile; only a job still Pending (or without status) gets the operator's.
        status: dict[str, Any] = {"masterRelaunches": 0, "selector": meta.selector(name, "worker"),
                                  "startTime": now_iso()}
        if _phase(self.kube.get_job(namespace, name)) in (None, "Pending"):
            status.update(phase="Pending", message=f"master pod {pod} created", workers={
                "desired": spec.worker.replicas, "active": 0, "summary": f"0/{spec.worker.replicas}"})
        self.kube.patch_status(job, status)
        if created:
            self.kube.event(job, reason="MasterCreated", message=f"created master pod {pod} and service {service}")
        return Outcome.CREATED

    def _create_object(self, what: str, create) -> bool:
        """``create()``; an API refusal becomes :class:`_Refused` naming ``what``."""
        try:
            return create()
        except Exception as exc:
            found = refusal(exc)
            if found is None:
                raise  # not the API server's answer (connection lost...): the sweep tries again
            raise _Refused(what, found) from exc

    def _on_refusal(self, job: dict, refused: _Refused) -> Outcome:
        """Fail the job for a permanent refusal; wait (backoff, one Event per new reason) for a retryable one."""
        uid = job["metadata"].get("uid")
        what, why = refused.what, refused.refusal
        if not why.retryable:
            self._backoff.pop(uid, None)
            self.fail(job, reason="MasterRefused", message=f"the API server refused to create {what}: {why}")
            return Outcome.REFUSED
        previous = self._backoff.get(uid)
        tries = previous.tries + 1 if previous else 1
        delay = min(RETRY_CAP, RETRY_FIRST * 2 ** (tries - 1))
        message = f"waiting to create {what}: {why}; try {tries}, next in {delay:.0f}s"
        self._backoff[uid] = _Backoff(tries, time.monotonic() + delay, str(why))
        status = {"message": message}
        if _phase(job) is None:
            status["phase"] = "Pending"
        self.kube.patch_status(job, status)
        if previous is None or previous.told != str(why):
            self.kube.event(job, reason="MasterPending", message=message, warning=True)
        log.info("%s/%s: %s", *_ident(job), message)
        return Outcome.WAITING

    def _relaunch(self, namespace: str, name: str, current: int, why: str) -> Outcome:
        job = self.kube.get_job(namespace, name)  # fresh: did the master conclude the job before dying?
        if job is None or job["metadata"].get("deletionTimestamp"):
            return Outcome.DELETING
        if _phase(job) in TERMINAL:
            return Outcome.OVER
        old = master_pod_name(name, current)
        budget = master_relaunch_budget(job)
        if current >= budget:
            self.fail(job, reason="MasterFailed",
                      message=f"master pod {old} {why}; relaunch budget "
                              f"(spec.replicaSpecs.master.relaunchBudget = {budget}) used up")
            return Outcome.FAILED
        new = master_pod_name(name, current + 1)
        created = self._create_object(f"master pod {new}", lambda: self.kube.create_pod(master_pod(job, index=current + 1)))
        self._backoff.pop(job["metadata"].get("uid"), None)
        message = (f"master pod {old} {why}: relaunched as {new} ({current + 1}/{budget}); "
                   "it resumes from the job's latest checkpoint")
        self.kube.patch_status(job, {"masterRelaunches": current + 1, "message": message})
        if created:
            self.kube.event(job, reason="MasterRelaunched", message=message, warning=True)
        return Outcome.RELAUNCHED

    # ---- relays to the master ------------------------------------------------------
    def _target(self, job: dict) -> str:
        namespace, name = _ident(job)
        return master_target(self.kube.get_service(namespace, meta.master_service_name(name)),
                             job=name, namespace=namespace)

    def scale(self, job: dict, *, old: Any, new: Any) -> Reply | None:
        """Relay a change of ``spec.replicaSpecs.worker.replicas`` to the master.

        Out-of-range values are refused with a Warning Event (the job keeps
        running with what it has). Raises MasterUnreachable when the master does
        not answer, so the caller can retry later.
        """
        if old is None or old == new or _phase(job) in TERMINAL:
            log.info("%s/%s: replicas %s -> %s: nothing to relay (phase %s)", *_ident(job), old, new, _phase(job))
            return None
        problem = _validate(job)
        if problem is not None:
            self.kube.event(job, reason="ScaleRejected",
                            message=f"cannot scale workers {old} -> {new}: {problem}", warning=True)
            return Reply(False, problem)
        reply = relay_scale(self._target(job), int(new))
        if reply.accepted:
            self.kube.event(job, reason="Scaling", message=f"workers {old} -> {new}: {reply.message}")
        else:
            self.kube.event(job, reason="ScaleRejected",
                            message=f"the master refused workers {old} -> {new}: {reply.message}", warning=True)
        return reply

    def sync_replicas(self, job: dict) -> Reply | None:
        """Level-triggered relay: a running master whose desired workers differ from the spec is told.

        Catches what an edge-triggered relay misses: a change made while the job
        was being created, or while the operator was down. A value the master or
        the range check refused is not re-sent (nor re-reported) until it changes.
        """
        status = job.get("status") or {}
        want = (((job.get("spec") or {}).get("replicaSpecs") or {}).get("worker") or {}).get("replicas")
        have = (status.get("workers") or {}).get("desired")
        uid = job["metadata"].get("uid")
        if status.get("phase") != "Running" or have is None or want is None or want == have:
            return None
        if self._refused.get(uid) == want:
            return None
        reply = self.scale(job, old=have, new=want)
        if reply is not None and not reply.accepted:
            self._refused[uid] = want
        return reply

    def sync_stop(self, job: dict) -> Reply | None:
        """Level-triggered stop: each running master of a job with ``flextrain.dev/stop`` is told once.

        Covers a master relaunched after the stop was relayed to its predecessor.
        """
        reason = (job["metadata"].get("annotations") or {}).get(meta.ANNOTATION_STOP)
        if not reason or _phase(job) != "Running":
            return None
        return self.stop(job, reason=reason)

    def stop(self, job: dict, *, reason: str) -> Reply | None:
        """Relay a stop request (the ``flextrain.dev/stop`` annotation) to the master, once per master.

        The handler and the sweep may race; a (job, master relaunch, reason) key
        taken under a lock lets exactly one of them send it.
        """
        if _phase(job) in TERMINAL:
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
        """Record a phase transition as an Event (Warning when the job failed)."""
        message = (job.get("status") or {}).get("message") or ""
        text = f"phase {old or 'None'} -> {new}" + (f": {message}" if message else "")
        self.kube.event(job, reason=f"Job{new}", message=text, warning=new == "Failed")


__all__ = ["TERMINAL", "MasterUnreachable", "Outcome", "Reconciler"]
