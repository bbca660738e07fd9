"""What the API server and the kubelet say about the master's pods: a refused create, a pod's end.

A create the API server refuses is a :class:`Refusal`, one of two kinds:

* permanent: 400 Bad Request, 401, 403 Forbidden by admission (PodSecurity,
  a webhook), 404 (the namespace is gone), 422 Invalid and every other 4xx not
  listed below. The same pod will be refused again, so the job fails with a
  message naming the pod and the API server's own words (the ``message`` of
  the ``Status`` it answered).
* retryable: 403 whose message says ``exceeded quota`` (a ResourceQuota is
  full; it frees when other pods end), 408, 409 Conflict (for a create: a
  leftover of the same name, which the backend deletes first), 429 Too Many
  Requests, 5xx, and no answer at all. The backend tries again with
  exponential backoff and says what the job is waiting for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KILLED = 137  # what a container killed by SIGKILL reports
OOM_KILLED = "OOMKilled"


@dataclass(frozen=True)
class Refusal:
    """Why the API server did not create ``what`` (``pod "x-worker-2"``, ``service "x-ps-0"``)."""

    what: str
    retryable: bool
    code: int | None  # HTTP status; None: no answer (connection refused, timeout)
    reason: str  # the Status reason ("Forbidden", "Invalid"), or the HTTP reason phrase
    text: str  # the API server's own words: the Status message, else the reason
    waiting_for: str = ""  # retryable: what the job waits for ("quota", "the API server (503 ...)")
    exists: bool = False  # 409 AlreadyExists: a leftover of the same name is in the way

    def message(self) -> str:
        """What the job's status says: ``waiting for quota: pods "x" is forbidden: exceeded quota ...``
        (retryable) or ``cannot create pod "x": the API server refused it (422 Invalid): ...``."""
        if self.retryable:
            return f"waiting for {self.waiting_for}: {self.text}"
        return f"cannot create {self.what}: the API server refused it ({self.code} {self.reason}): {self.text}"


def refusal_of(exc: BaseException, *, what: str) -> Refusal:
    """Classify what a create raised (an ``ApiException``, or a connection error)."""
    code = getattr(exc, "status", None)
    if not isinstance(code, int) or code == 0:  # no HTTP answer: the API server is unreachable
        return Refusal(what, True, None, type(exc).__name__, f"could not reach it: {exc}",
                       waiting_for="the API server")
    status = _status_body(getattr(exc, "body", None))
    reason = str(status.get("reason") or getattr(exc, "reason", "") or "")
    text = str(status.get("message") or f"{code} {reason}").strip()
    if code == 403 and "exceeded quota" in text:
        return Refusal(what, True, code, reason, text, waiting_for="quota")
    if code == 409:
        exists = "alreadyexists" in reason.replace(" ", "").lower() or "already exists" in text.lower()
        waiting = f"the earlier {what} to go" if exists else f"a conflict over {what} to clear"
        return Refusal(what, True, code, reason, text, waiting_for=waiting, exists=exists)
    if code in (408, 429) or code >= 500:
        return Refusal(what, True, code, reason, text, waiting_for=f"the API server ({code} {reason})")
    return Refusal(what, False, code, reason, text)


def _status_body(body: Any) -> dict:
    """The ``Status`` object of an error reply ({} when the body is not one)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        status = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        return {}
    return status if isinstance(status, dict) else {}


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


__all__ = ["KILLED", "OOM_KILLED", "Refusal", "oom_message", "pod_exit", "refusal_of", "termination_message"]
