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


__all__ = ["KILLED", "OOM_KILLED", "oom_message", "pod_exit", "termination_message"]
