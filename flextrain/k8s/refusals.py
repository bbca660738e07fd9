"""What the API server says when it refuses to create or patch an object, and whether asking again may help.

Shared by the operator (master pods and Services) and the master's pod backend
(worker and PS pods, PS Services). A refusal is one of two kinds:

* permanent: 400 Bad Request, 401, 403 Forbidden by admission (PodSecurity,
  a webhook, a LimitRange), 404 (the namespace is gone), 422 Invalid and every
  other 4xx not listed below. The same object will be refused again, so the
  job fails with a message naming the object and the API server's own words
  (the ``message`` of the ``Status`` it answered).
* retryable: 403 whose message says ``exceeded quota`` (a ResourceQuota is
  full; it frees when other pods end), 408, 409 Conflict (for a create: a
  leftover of the same name), 429 Too Many Requests, 5xx, and no answer at
  all. The caller tries again with exponential backoff and says what the job
  is waiting for.

A refused patch (the job's status or spec: a validating webhook, the CRD's
schema, throttling) is classified the same way; its ``action`` is ``patch``.
Whoever patches raises :class:`Refused`, so the caller decides what the user is
told (a Warning Event when the status itself cannot be written).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any


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
    action: str = "create"  # or "patch"

    def message(self) -> str:
        """What the job's status says: ``waiting for quota: pods "x" is forbidden: exceeded quota ...``
        (retryable) or ``cannot create pod "x": the API server refused it (422 Invalid): ...``."""
        if self.retryable:
            return f"waiting for {self.waiting_for}: {self.text}"
        return f"cannot {self.action} {self.what}: the API server refused it ({self.code} {self.reason}): {self.text}"


class Refused(Exception):
    """The API server refused (or did not answer) a create or patch; ``refusal`` says which and why."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message())
        self.refusal = refusal


def refusal_of(exc: BaseException, *, what: str, action: str = "create") -> Refusal:
    """Classify what a create or patch raised (an ``ApiException``, or a connection error)."""
    return replace(_classify(exc, what=what), action=action)


def _classify(exc: BaseException, *, what: str) -> Refusal:
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


__all__ = ["Refusal", "Refused", "refusal_of"]
