"""Settling a job's worker count: ``spec.replicaSpecs.worker.replicas`` relayed to the master, or reverted.

``kubectl scale``, ``flextrain scale`` and edits change the spec; the master
runs what its ``Scale`` RPC was told. A count the spec does not allow
(outside ``minReplicas..maxReplicas``) or a scale of a finished job is never
relayed: the spec is put back, so it keeps saying what the job really runs
(a relaunched master would exit on an invalid one), with one Warning Event.
Reverting rather than clamping: a clamp would run a count nobody asked for.

The kopf field handler (edge) and the sweep (level) both settle; what this
process remembers keeps one action to one Event when they race, and an
operator restart forgets it at the cost of at most one repeated relay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flextrain.k8s.refusals import Refused
from flextrain.operator.jobview import TERMINAL, ident, phase_of, spec_problems
from flextrain.operator.kube import Kube
from flextrain.operator.relay import Reply, Target, relay_scale


class ReplicaSettler:
    def __init__(self, kube: Kube, *, target: Callable[[dict], Target]) -> None:
        self.kube = kube
        self._target = target  # the master's gRPC address for a job, with its TLS material
        # By job uid: a lock each, the (have, want) relayed or reported last, and the
        # (refused, restored) pair of the revert the field handler is yet to see.
        self._scaling: dict[str, threading.Lock] = {}
        self._relayed: dict[str, tuple[Any, Any]] = {}
        self._reverted: dict[str, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

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

    def sync(self, job: dict) -> Reply | None:
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
        namespace, name = ident(job)
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
                try:
                    reverted = self._revert(job, want=want, back=back)
                except Refused as exc:  # the spec keeps the count: say so, once
                    return self._report_once(job, key=(have, want), message=(
                        f"{message}; reverting spec.replicaSpecs.worker.replicas to {back} failed: {exc}"))
                if reverted:
                    message += f"; spec.replicaSpecs.worker.replicas reverted to {back}"
                    self.kube.event(job, reason="ScaleRejected", message=message, warning=True)
                    return Reply(False, message)
            return None
        finally:
            lock.release()

    def _refusal(self, job: dict, *, want: Any, have: Any, old: Any) -> tuple[Any, str] | None:
        """(value to revert to or None, why) when the spec's count must not be run; None if it may."""
        phase = phase_of(job)
        if phase in TERMINAL:
            return have, f"cannot scale workers to {want}: the job has finished ({phase})"
        problem = spec_problems(job)
        if problem is None:
            return None
        back = next((v for v in (old, have) if v is not None and spec_problems(_with_replicas(job, v)) is None), None)
        if back is None:
            return None, f"cannot scale workers {have} -> {want}: {problem}"
        worker = _worker_spec(job)
        lo, hi = worker.get("minReplicas", 1), worker.get("maxReplicas", "unbounded")
        return back, (f"cannot scale workers to {want}: {problem}; allowed: spec.replicaSpecs.worker.minReplicas"
                      f"..maxReplicas = {lo}..{hi}")

    def _revert(self, job: dict, *, want: Any, back: Any) -> bool:
        """Put ``back`` into the spec; False if the job changed since it was read (decide again)."""
        namespace, name = ident(job)
        uid = job["metadata"].get("uid")
        with self._lock:
            self._reverted[uid] = (want, back)  # the field handler will see want -> back: ours
        try:
            # resourceVersion: a newer change of the spec is not overwritten (409 instead).
            self.kube.patch_spec(namespace, name, {
                "metadata": {"resourceVersion": job["metadata"].get("resourceVersion")},
                "spec": {"replicaSpecs": {"worker": {"replicas": back}}}})
        except Refused as exc:
            with self._lock:
                self._reverted.pop(uid, None)
            if exc.refusal.code == 409:
                return False
            raise
        return True

    def _relay_replicas(self, job: dict, *, have: Any, want: Any, relay_phases: tuple[str, ...]) -> Reply | None:
        uid = job["metadata"].get("uid")
        if phase_of(job) not in relay_phases or self._relayed.get(uid) == (have, want):
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


__all__ = ["ReplicaSettler"]
