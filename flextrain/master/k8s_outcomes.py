"""What the kubelet says about the master's pods: how a pod's container ended, and its last words.

(What the API server says when it refuses a create is :mod:`flextrain.k8s.refusals`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KILLED = 137  # what a container killed by SIGKILL reports
OOM_KILLED = "OOMKilled"


def pod_exit(kind: str, pod: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(exit code, reason)`` if this event ends the Pod's container, else None.

    Phase ``Succeeded``/``Failed``: the container's ``exitCode`` (1 when the Pod
    failed before its container ran, e.g. evicted or a config error); deleted
    before it reported an exit: 137, as a container killed by SIGKILL.
    """
    status = pod.get("status") or {}
    phase = status.get("phase")
    term = next((cs["state"]["terminated"] for cs in status.get("containerStatuses") or []
                 if (cs.get("state") or {}).get("terminated")), None)
    if phase in ("Succeeded", "Failed"):
        code = term["exitCode"] if term else (0 if phase == "Succeeded" else 1)
        reason = (term or {}).get("reason") or status.get("reason") or ("Completed" if code == 0 else "Error")
        return int(code), reason
    if kind == "DELETED":
        return (int(term["exitCode"]), term.get("reason") or "Error") if term else (KILLED, "Deleted")
    return None


# Pod status reasons of a pod the cluster took away (kubelet eviction, scheduler preemption, node shutdown).
DISRUPTION_REASONS = ("Preempted", "Preempting", "Evicted", "Terminated", "Shutdown", "NodeShutdown", "NodeLost")


def disruption(pod: Mapping[str, Any]) -> str | None:
    """Why the cluster took this pod away (preempted, evicted, its node drained), else None.

    Kubernetes marks such a pod with a ``DisruptionTarget`` condition (its reason:
    ``PreemptionByScheduler``, ``EvictionByEvictionAPI``, ``DeletionByTaintManager``,
    ``TerminationByKubelet``); an older kubelet's eviction only says ``status.reason: Evicted``.
    A pod deleted by a user or by the master has neither: that is not a disruption.
    """
    status = pod.get("status") or {}
    for cond in status.get("conditions") or ():
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return cond.get("reason") or "DisruptionTarget"
    reason = status.get("reason")
    return reason if reason in DISRUPTION_REASONS else None


def unscheduled_reason(pod: Mapping[str, Any]) -> str | None:
    """``Unschedulable: <the scheduler's message>`` for a pod the scheduler could not place yet."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x) or "not scheduled"
    return None


def termination_message(pod: Mapping[str, Any]) -> str:
    """The terminated container's message (``FallbackToLogsOnError``: its last log lines), else the
    Pod's own status message (a Pod that failed before its container ran says why there)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        if (term := (cs.get("state") or {}).get("terminated")) and term.get("message"):
            return str(term["message"])
    return str(status.get("message") or "")


def oom_message(role: str, instance_id: str, kills: int, limit: int) -> str:
    more = f"spec.replicaSpecs.{role}.resources.limits.memory"
    smaller = " or a smaller spec.training.maxMicroBatch" if role == "worker" else ""
    return (f"{role} pods were OOMKilled {kills} times (last: {instance_id}; at most {limit} are retried): "
            f"give them more memory ({more}){smaller}")


__all__ = ["DISRUPTION_REASONS", "KILLED", "OOM_KILLED", "disruption", "oom_message", "pod_exit",
           "termination_message", "unscheduled_reason"]
