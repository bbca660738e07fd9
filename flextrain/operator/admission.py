"""May an ElasticJob that has no master yet start now? ``spec.suspend`` and gang admission.

This module is only about a job that has not started: one with
``spec.suspend: true`` and no master pod is not started (phase ``Pending``,
the reason in its status message and an ``Admitted=False`` condition) and
starts when ``suspend`` becomes false -- what Kueue's admission needs.
Suspending a job that runs (checkpoint, release its pods, resume later) is a
different path and lives elsewhere.

With ``spec.scheduling.gang: volcano`` the operator creates the job's
PodGroup (:func:`flextrain.k8s.gang.pod_group`) and waits for Volcano to put
it ``Inqueue`` before it creates the master, as Volcano's own job controller
does. Neither controller can run in flextrain's tests: they are emulated by
flipping ``suspend`` and writing the PodGroup's ``status.phase``.
"""

from __future__ import annotations

from flextrain.k8s import gang
from flextrain.k8s.job_status import observed_generation
from flextrain.k8s.meta import now_iso
from flextrain.operator.kube import Kube


def waiting_for(kube: Kube, job: dict) -> tuple[str, str] | None:
    """``(reason, message)`` while the job must not start yet; None once it may.

    Creates the job's Volcano PodGroup (idempotently) so Volcano can admit it.
    """
    spec = job.get("spec") or {}
    kind, queue = gang.scheduling(job)
    if spec.get("suspend"):
        if kind == gang.KUEUE:
            return "Suspended", (f"waiting for admission: suspended until Kueue admits it (LocalQueue {queue}, "
                                 "label kueue.x-k8s.io/queue-name)")
        return "Suspended", "suspended (spec.suspend: true): the job starts when spec.suspend is set to false"
    if kind == gang.VOLCANO:
        group = kube.ensure_pod_group(gang.pod_group(job))
        phase = (group.get("status") or {}).get("phase")
        if phase not in gang.ADMITTED_PHASES:
            where = f", queue {queue}" if queue else ""
            return "PodGroupNotAdmitted", (
                f"waiting for admission: PodGroup {group['metadata']['name']} is {phase or 'Pending'} "
                f"(Volcano{where}; minMember {gang.min_member(job)}: parameter servers and minReplicas workers); "
                "the master is created once it is Inqueue")
    return None


def with_default_scheduling(kube: Kube, job: dict, default: dict | None) -> dict:
    """The job with the operator's default ``spec.scheduling`` written into it when it sets none (the chart's
    ``scheduling`` value); a Kueue default also labels it with its queue and suspends it until admitted."""
    spec = job.get("spec") or {}
    if not default or spec.get("scheduling") is not None:
        return job
    patch: dict = {"spec": {"scheduling": dict(default)}}
    if default.get("gang") == gang.KUEUE:
        patch["spec"]["suspend"] = True
        patch["metadata"] = {"labels": gang.job_labels(gang.KUEUE, default.get("queue"))}
    return kube.patch_spec(job["metadata"]["namespace"], job["metadata"]["name"], patch)


def admitted_condition(admitted: bool, *, reason: str, message: str = "") -> dict:
    """The ``Admitted`` condition of the job's status."""
    cond = {"type": "Admitted", "status": "True" if admitted else "False", "reason": reason,
            "lastTransitionTime": now_iso()}
    if message:
        cond["message"] = message
    return cond


def hold(kube: Kube, job: dict, *, reason: str, message: str) -> None:
    """Keep the job Pending saying why (written only when the message changes: the sweep repeats this);
    one Normal Event per distinct reason."""
    status = job.get("status") or {}
    if status.get("phase") == "Pending" and status.get("message") == message:
        return
    kube.patch_status(job, {"phase": "Pending", "message": message, **observed_generation(job),
                            "conditions": [admitted_condition(False, reason=reason, message=message)]})
    kube.event(job, reason="WaitingForAdmission", message=message, key=f"admission-{reason.lower()}")


__all__ = ["admitted_condition", "hold", "waiting_for", "with_default_scheduling"]
