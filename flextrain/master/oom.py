"""Out-of-memory workers: a worker killed for memory is not relaunched unchanged.

A worker whose exit reason is ``OOMKilled`` (its pod's container over its memory limit on Kubernetes;
locally, one over ``--worker-memory-limit``, flextrain/master/memwatch.py) is relaunched as every
failed worker is, but first :meth:`OutOfMemory.killed` changes what it will run with:

* the ElasticJob gives a memory ladder (``replicaSpecs.worker.memoryLadder: [4Gi, 8Gi]``) with a size
  left: every worker pod launched from now on, the replacement included, gets the next size as its
  memory limit (and request); the micro-batch stays;
* else the micro-batch M of the job is halved (from the M of the round the worker was in): the next
  round plans with it, G unchanged, so the accumulation steps rise (flextrain/elastic/planner.py);
  two workers of one round killed together halve it once;
* M was 1 already: nothing smaller exists, and the job fails with that reason.

Each action is a job event (the status message) and ``status.json``'s ``maxMicroBatchChoice.outOfMemory``
lists them. The exit itself is judged as any infrastructure failure (relaunched within the relaunch
budget; the rollback or settlement of the round keeps every record applied exactly once).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OutOfMemory:
    ladder: tuple[str, ...] = ()  # memory sizes to climb, smallest first (Kubernetes quantities)
    rung: int = -1  # the ladder's size workers now get; -1: the spec's own resources
    cap: int | None = None  # the largest M a round may plan with since an OOM kill; None: no cap
    actions: list[dict] = field(default_factory=list)  # what each kill changed, for status.json

    @property
    def memory(self) -> str | None:
        """The memory limit a worker launched now gets (None: the pod spec's own)."""
        return self.ladder[self.rung] if self.rung >= 0 else None

    def killed(self, worker_id: str, *, round_m: int) -> tuple[str, bool]:
        """``worker_id`` was OOMKilled while planning with micro-batch ``round_m``: ``(what was done,
        fatal)``; ``fatal``: no smaller micro-batch is left, the job must fail."""
        if self.rung + 1 < len(self.ladder):
            self.rung += 1
            action = f"relaunching workers with memory {self.memory} (replicaSpecs.worker.memoryLadder)"
        elif round_m <= 1:
            action = "nothing left to lower: it ran with the smallest micro-batch (1)"
            self.actions.append({"worker": worker_id, "maxMicroBatch": round_m, "action": action})
            return f"{worker_id} was OOMKilled (out of memory) at the smallest micro-batch 1", True
        else:
            lowered = max(1, round_m // 2)
            if self.cap is not None and self.cap <= lowered:
                return f"{worker_id} was OOMKilled with micro-batch {round_m}; the job already plans with " \
                       f"{self.cap}", False
            self.cap = lowered
            action = f"micro-batch {round_m} -> {lowered}, the global batch unchanged"
        self.actions.append({"worker": worker_id, "maxMicroBatch": round_m, "action": action})
        return f"{worker_id} was OOMKilled (out of memory) with micro-batch {round_m}: {action}", False

    def limit(self, m: int) -> int:
        """``m`` under the cap the kills set."""
        return m if self.cap is None else min(m, self.cap)


__all__ = ["OutOfMemory"]
