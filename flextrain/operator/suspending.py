"""``spec.suspend`` flipped on a running ElasticJob, relayed to its master (Kubernetes' Job convention).

``true`` asks the master to suspend (flextrain/master/suspension.py: a checkpoint at the next step
boundary, every worker pod deleted, phase ``Suspended``); ``false`` to resume. Only a job whose master
trains or waits suspended is relayed to (phase ``Running`` or ``Suspended``): a job created suspended has
no master yet, and whatever admits it starts one (a master also reads ``spec.suspend`` when it starts,
so one relaunched while the job is suspended stays so). The master's answer becomes an Event on the
job: ``Suspending``/``Resuming``, or a Warning ``SuspendRejected`` naming why.
"""

from __future__ import annotations

from typing import Any

from flextrain.operator.jobview import phase_of
from flextrain.operator.relay import Reply, Target, relay_suspend


def relay_suspend_change(kube, job: dict, *, target: Target | str, old: Any, new: Any) -> Reply | None:
    """Relay ``spec.suspend`` going ``old`` -> ``new`` to the master at ``target``; None: nothing to relay.
    Raises MasterUnreachable when the master does not answer (the kopf handler retries)."""
    suspend = bool(new)
    if bool(old) == suspend or phase_of(job) not in ("Running", "Suspended"):
        return None
    reason = "spec.suspend: true" if suspend else "spec.suspend: false"
    reply = relay_suspend(target, suspend, reason)
    kube.event(job, reason=("Suspending" if suspend else "Resuming") if reply.accepted else "SuspendRejected",
               message=reply.message, warning=not reply.accepted)
    return reply


__all__ = ["relay_suspend_change"]
