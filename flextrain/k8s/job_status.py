"""The status an ElasticJob ends with, whoever ends it; and the conditions that follow its phase.

Three writers end a job: its master, from its status snapshots (flextrain/master/k8s_status.py);
the master pod that will not run it (flextrain/cli/cluster.py: preflight, a stop requested before it
started, a resume it cannot make); and the operator (an invalid spec, a refused master pod, a used-up
relaunch budget, ``activeDeadlineSeconds``). ``kubectl wait --for=condition=Failed`` and a reader of
``.status.failure`` must not have to know which one did, so all of them build the patch here:

* conditions: ``Failed`` (or ``Succeeded``) True with the reason and message, ``Running`` False,
  conditions of other types (the operator's ``Admitted``) kept;
* ``completionTime`` now, and a ``startTime`` never after it (a job that ended before anyone wrote
  one gets the same time);
* ``workers.active`` 0: an ended job runs no worker (the operator deletes what is left);
* ``failure`` when the writer knows the cause, ``observedGeneration`` when the object has a
  ``metadata.generation`` (the spec the writer acted on).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from flextrain.k8s import meta

TERMINAL = ("Succeeded", "Failed")


def conditions_for(phase: str, message: str, previous: Sequence[Mapping[str, Any]], *,
                   reason: str | None = None) -> list[dict]:
    """Conditions after a move to ``phase``; a condition keeps its time while its status stands.

    ``reason`` (default: the phase) is the reason of the conditions that change, e.g. ``InvalidSpec``.
    """
    wanted = {"Running": "True" if phase == "Running" else "False"}
    if phase in TERMINAL:
        wanted[phase] = "True"
    old = {c["type"]: c for c in previous}
    out = []
    for kind, value in wanted.items():
        cond = old.get(kind)
        if cond is None or cond.get("status") != value:
            cond = {"type": kind, "status": value, "reason": reason or phase, "lastTransitionTime": meta.now_iso()}
            if message and kind == phase:
                cond["message"] = message
        out.append(dict(cond))
    return out + [dict(c) for c in previous if c["type"] not in wanted]


def observed_generation(job: Mapping[str, Any] | None) -> dict[str, int]:
    """``{"observedGeneration": N}`` for the ``metadata.generation`` of the reading ``job``; {} without one
    (an API server always sets it; an emulator may not, and a guess would claim a spec nobody acted on)."""
    generation = ((job or {}).get("metadata") or {}).get("generation")
    return {"observedGeneration": generation} if isinstance(generation, int) and generation > 0 else {}


def _time(stamp: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None


def ended_status(job: Mapping[str, Any], *, phase: str, message: str, reason: str | None = None,
                 failure: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The status patch that ends ``job`` (as last read) in ``phase`` (see the module docstring)."""
    old = job.get("status") or {}
    now = meta.now_iso()
    status: dict[str, Any] = {
        "phase": phase, "message": message, "completionTime": now,
        "conditions": conditions_for(phase, message, old.get("conditions") or (), reason=reason),
        **observed_generation(job),
    }
    started = _time(old.get("startTime")) if old.get("startTime") else None
    if started is None or started > _time(now):
        status["startTime"] = now
    if failure:
        status["failure"] = {k: v for k, v in failure.items() if v not in (None, "")}
    workers = old.get("workers")
    if isinstance(workers, Mapping):
        status["workers"] = {"active": 0, "summary": f"0/{workers.get('desired', 0)}"}
        if workers.get("pending"):
            status["workers"]["pending"] = 0
    return status


__all__ = ["TERMINAL", "conditions_for", "ended_status", "observed_generation"]
