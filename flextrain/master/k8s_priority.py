"""Priority-based elasticity: which PriorityClass a new worker pod gets (ElasticDL's central idea).

A job keeps a guaranteed core of ``minReplicas`` workers under
``replicaSpecs.worker.priorityClassName`` and borrows idle capacity with the
rest under ``elasticPriorityClassName``, which the scheduler preempts first
when other work needs the nodes. The core is a count, not a set of names: a
new worker joins the core while fewer than ``minReplicas`` live workers are
in it (so the replacement of a lost core worker is core again), else the
elastic part. Spares are elastic. Without ``elasticPriorityClassName`` every
worker gets ``priorityClassName`` (or none), as before.

A preempted worker shrinks the job without spending the relaunch budget
(:meth:`flextrain.master.instances.InstanceManager.exited`); its replacement is
created at once and waits ``Pending`` until capacity returns, then joins the
next rendezvous round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class PriorityClasses:
    def __init__(self, job: Mapping[str, Any]) -> None:
        worker = ((job.get("spec") or {}).get("replicaSpecs") or {}).get("worker") or {}
        self.core: str | None = worker.get("priorityClassName")
        self.elastic: str | None = worker.get("elasticPriorityClassName")
        self.min_replicas = int(worker.get("minReplicas") or worker.get("replicas") or 1)

    def choose(self, live_classes: Iterable[str | None], *, spare: bool = False) -> str | None:
        """The class of a new worker pod, given the classes of the job's live worker pods."""
        if not self.elastic:
            return self.core
        if spare:
            return self.elastic
        in_core = sum(1 for c in live_classes if c == self.core)
        return self.core if in_core < self.min_replicas else self.elastic


def membership(*, active: int, desired: int, pending: int, preempted: int, last_disruption: str,
               unscheduled: str | None) -> dict:
    """The status's ``workers`` beyond desired/active: ``pending`` worker pods, workers ``preempted`` so
    far and, while fewer are active than desired, the ``reason``."""
    out: dict = {"pending": pending, "preempted": preempted}
    if active >= desired:
        return out
    parts = []
    if pending:
        parts.append(f"{pending} pending" + (f" ({unscheduled})" if unscheduled else ""))
    if preempted:
        parts.append(f"{preempted} preempted so far (last {last_disruption}; no relaunch budget spent)")
    joining = desired - active - pending
    if joining > 0:
        parts.append(f"{joining} starting or joining the next round")
    out["reason"] = "; ".join(parts)
    return out


__all__ = ["PriorityClasses", "membership"]
