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
from flextrain.operator.phases import phases_entered
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
        # Replica settling (see _settle_replicas), by job uid: a lock each, the (have, want) relayed or
        # reported last, and the (refused, restored) pair of the revert the field handler is yet to see.
        self._scaling: dict[str, threading.Lock] = {}
        self._relayed: dict[str, tuple[Any, Any]] = {}
        self._reverted: dict[str, tuple[Any, Any]] = {}
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
        problem = _validate(job)
        if problem is not None:  # a new master would exit at once on this spec (exit code 2): say why
            self.fail(job, reason="InvalidSpec", message=f"{problem} (master pod {old} {why}; not relaunched)")
            return Outcome.INVALID
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
        """Edge-triggered: ``spec.replicaSpecs.worker.replicas`` went ``old`` -> ``new`` (``kubectl scale``).

        Settles the job's replicas as :meth:`_settle_replicas` describes, relaying
        to a Pending master too (kopf retries while it starts). The change that
        reverted a refused value is recognised and does nothing. Raises
        MasterUnreachable when the master does not answer, so the caller can
        retry later.
        """
        uid = job["metadata"].get("uid")
        with self._lock:
            ours = old is not None and self._reverted.get(uid) == (old, new)
            if ours:
                del self._reverted[uid]
        if old is None or old == new or ours:
            return None  # creation (the master starts with the spec's count), or our own revert
        return self._settle_replicas(job, old=old, relay_phases=("Pending", "Running"), wait=True)

    def sync_replicas(self, job: dict) -> Reply | None:
        """Level-triggered (the sweep): a spec the job does not run with is relayed or reverted.

        Catches what an edge-triggered relay misses: a change made while the job
        was being created, or while the operator was down. Relays only to a
        Running master; skips a job whose replicas a handler is settling now.
        """
        return self._settle_replicas(job, old=None, relay_phases=("Running",), wait=False)

    def _settle_replicas(self, job: dict, *, old: Any, relay_phases: tuple[str, ...], wait: bool) -> Reply | None:
        """Make the job run ``spec.replicaSpecs.worker.replicas`` workers, or put the spec back.

        ``have`` is the count the job runs with: ``status.workers.desired`` (what
        its master wants; the operator writes the spec's count there at creation),
        else ``old``. The spec asking for another count is settled once:

        * job finished (Succeeded/Failed): refused, the spec reverted to ``have``;
        * count outside ``minReplicas..maxReplicas`` (or otherwise not a count the
          spec allows): refused, the spec reverted to ``old`` when that was valid,
          else ``have``; a relaunched master would exit on the invalid spec;
        * otherwise relayed to the master (Scale RPC) when the job is in
          ``relay_phases``; its answer is reported; the same (have, want) is not
          relayed (nor reported) again.

        One Warning Event ``ScaleRejected`` per refusal, one ``Scaling`` per
        relay. The edge handler and the sweep both come here: a per-job lock and
        a fresh read of the job make the first one act and the other find the
        spec reverted or the relay recorded.
        """
        namespace, name = _ident(job)
        uid = job["metadata"].get("uid")
        with self._lock:
            lock = self._scaling.setdefault(uid, threading.Lock())
        if not lock.acquire(blocking=wait):
            return None  # a handler is settling this job's replicas now
        try:
            for _ in range(3):  # a revert that lost a race with another write decides again
                job = self.kube.get_job(namespace, name)
                if job is None or job["metadata"].get("deletionTimestamp"):
                    return None
                want = _spec_replicas(job)
                have = ((job.get("status") or {}).get("workers") or {}).get("desired")
                have = old if have is None else have
                if want is None or have is None or want == have:
                    if want == have:
                        self._relayed.pop(uid, None)  # settled: the next difference is a new request
                    return None
                refusal = self._refusal(job, want=want, have=have, old=old)
                if refusal is None:
                    return self._relay_replicas(job, have=have, want=want, relay_phases=relay_phases)
                back, message = refusal
                if back is None:  # the spec is invalid beyond the count: reported once, nothing to revert
                    return self._report_once(job, key=(have, want), message=message)
                if self._revert(job, want=want, back=back):
                    self.kube.event(job, reason="ScaleRejected", message=message, warning=True)
                    return Reply(False, message)
            return None
        finally:
            lock.release()

    def _refusal(self, job: dict, *, want: Any, have: Any, old: Any) -> tuple[Any, str] | None:
        """(value to revert to or None, message) when the spec's count must not be run; None if it may."""
        phase = _phase(job)
        if phase in TERMINAL:
            return have, (f"cannot scale workers to {want}: the job has finished ({phase}); "
                          f"spec.replicaSpecs.worker.replicas reverted to {have}")
        problem = _validate(job)
        if problem is None:
            return None
        back = next((v for v in (old, have) if v is not None and _validate(_with_replicas(job, v)) is None), None)
        if back is None:
            return None, f"cannot scale workers {have} -> {want}: {problem}"
        worker = _worker_spec(job)
        lo, hi = worker.get("minReplicas", 1), worker.get("maxReplicas", "unbounded")
        return back, (f"cannot scale workers to {want}: {problem}; allowed: spec.replicaSpecs.worker.minReplicas"
                      f"..maxReplicas = {lo}..{hi}; spec.replicaSpecs.worker.replicas reverted to {back}")

    def _revert(self, job: dict, *, want: Any, back: Any) -> bool:
        """Put ``back`` into the spec; False if the job changed since it was read (decide again)."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = _ident(job)
        uid = job["metadata"].get("uid")
        with self._lock:
            self._reverted[uid] = (want, back)  # the field handler will see want -> back: ours
        try:
            # resourceVersion: a newer change of the spec is not overwritten (409 instead).
            self.kube.patch_spec(namespace, name, {
                "metadata": {"resourceVersion": job["metadata"].get("resourceVersion")},
                "spec": {"replicaSpecs": {"worker": {"replicas": back}}}})
        except ApiException as exc:
            with self._lock:
                self._reverted.pop(uid, None)
            if exc.status == 409:
                return False
            raise
        return True

    def _relay_replicas(self, job: dict, *, have: Any, want: Any, relay_phases: tuple[str, ...]) -> Reply | None:
        uid = job["metadata"].get("uid")
        if _phase(job) not in relay_phases or self._relayed.get(uid) == (have, want):
            return None
        reply = relay_scale(self._target(job), int(want))  # MasterUnreachable: nothing recorded, retried
        self._relayed[uid] = (have, want)
        if reply.accepted:
            self.kube.event(job, reason="Scaling", message=f"workers {have} -> {want}: {reply.message}")
        else:
            self.kube.event(job, reason="ScaleRejected",
                            message=f"the master refused workers {have} -> {want}: {reply.message}", warning=True)
        return reply

    def _report_once(self, job: dict, *, key: tuple[Any, Any], message: str) -> Reply | None:
        uid = job["metadata"].get("uid")
        if self._relayed.get(uid) == key:
            return None
        self._relayed[uid] = key
        self.kube.event(job, reason="ScaleRejected", message=message, warning=True)
        return Reply(False, message)

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


def _worker_spec(job: dict) -> dict:
    return ((job.get("spec") or {}).get("replicaSpecs") or {}).get("worker") or {}


def _spec_replicas(job: dict) -> Any:
    return _worker_spec(job).get("replicas")


def _with_replicas(job: dict, replicas: Any) -> dict:
    """``job`` with another worker count in its spec (a copy of the parts on the way)."""
    spec = dict(job.get("spec") or {})
    replica_specs = dict(spec.get("replicaSpecs") or {})
    replica_specs["worker"] = {**(replica_specs.get("worker") or {}), "replicas": replicas}
    return {**job, "spec": {**spec, "replicaSpecs": replica_specs}}


__all__ = ["TERMINAL", "MasterUnreachable", "Outcome", "Reconciler"]
