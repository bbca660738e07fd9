"""What the master knows of its workers' memory: the micro-batch limit of each round, and memory samples.

:class:`MicroBatchChoice` decides M, the micro-batch limit every member of a round plans its steps
with (``JoinRendezvousResponse.max_micro_batch``). Contract:

* ``--max-micro-batch N``: every round gets N; unset: the global batch.
* ``--max-micro-batch auto``: each AllReduce worker probes the largest micro-batch whose training step
  stays under its memory limit before it registers, and registers with it
  (``RegisterWorkerRequest.probe``). A round gets the smallest probe of its members, so every member
  splits a step alike and none is given more than it measured; a newcomer with a smaller probe lowers
  M from the round it joins (its registration ends the running round), and one that leaves with the
  smallest lets M rise from the next round. A round none of whose members reported takes the smallest
  probe of any worker seen, else the global batch (the probe's upper bound).

:class:`MemoryBook` keeps each worker's latest memory sample (``HeartbeatRequest.memory``, taken once
per optimizer step) and the job's peak, for status.json.

Both are plain bookkeeping; the master calls them under its lock.
"""

from __future__ import annotations

from flextrain.job import JobSpec
from flextrain.master.oom import OutOfMemory
from flextrain.proto import flextrain_pb2 as pb


class MicroBatchChoice:
    def __init__(self, spec: JobSpec) -> None:
        self.auto = spec.training.auto_micro_batch
        self.setting = spec.training.max_micro_batch  # as given: N, "auto" or None
        self.memory_limit = spec.training.memory_limit  # as given; None: each worker's default
        self.fallback = spec.training.effective_max_micro_batch  # N, else the global batch (auto's upper bound)
        self.probes: dict[str, dict] = {}  # worker id -> what its probe found, as status.json shows it
        self.current = self.fallback  # the M of the latest round
        self.oom = OutOfMemory()  # what out-of-memory kills changed: a cap on M, a memory ladder's rung

    def report(self, worker_id: str, probe: pb.MicroBatchProbe | None) -> None:
        """A worker registered with (or without) a probe; a relaunched worker's replaces its last."""
        if probe is None or probe.max_micro_batch < 1:
            self.probes.pop(worker_id, None)
            return
        self.probes[worker_id] = {"maxMicroBatch": probe.max_micro_batch, "memoryLimit": probe.memory_limit,
                                  "peakBytes": probe.peak_bytes, "cached": probe.cached, "device": probe.device}

    def for_round(self, members: list[str]) -> tuple[int, str]:
        """M for a round of ``members`` and how it was chosen (for the job's events), under the cap that
        out-of-memory kills set (flextrain/master/oom.py)."""
        m, why = self._chosen(members)
        if self.oom.limit(m) < m:
            m, why = self.oom.limit(m), "lowered after out-of-memory kills (OOMKilled)"
        self.current = m
        return m, why

    def _chosen(self, members: list[str]) -> tuple[int, str]:
        if not self.auto:
            return self.fallback, "--max-micro-batch" if self.setting is not None else "the global batch"
        sizes = {w: self.probes[w]["maxMicroBatch"] for w in members if w in self.probes}
        if sizes:
            smallest = min(sizes, key=lambda w: (sizes[w], w))
            why = f"the smallest probe of its members: {smallest}'s"
        elif self.probes:
            sizes = {w: p["maxMicroBatch"] for w, p in self.probes.items()}
            smallest = min(sizes, key=lambda w: (sizes[w], w))
            why = f"no member reported a probe: the smallest of any worker, {smallest}'s"
        else:
            return self.fallback, "no worker reported a probe: the global batch"
        return sizes[smallest], why

    def status(self) -> dict:
        """``{"maxMicroBatch": M, "maxMicroBatchChoice": {...}}`` for status.json: M of the latest
        round and how it was chosen (the setting; under auto the limit and every worker's probe)."""
        choice: dict = {"setting": self.setting}
        if self.auto:
            choice.update(memoryLimit=self.memory_limit, rule="the smallest probe of the round's members",
                          probes={w: dict(p) for w, p in sorted(self.probes.items())})
        if self.oom.actions:
            choice["outOfMemory"] = [dict(a) for a in self.oom.actions]
        return {"maxMicroBatch": self.current, "maxMicroBatchChoice": choice}


class MemoryBook:
    def __init__(self) -> None:
        self.latest: dict[str, dict] = {}  # worker id -> its latest sample, as status.json shows it
        self.peak: dict | None = None  # the highest peak any worker reported: {peakBytes, worker, step, device}

    def record(self, worker_id: str, sample: pb.MemorySample) -> None:
        shown = {"step": sample.step, "device": sample.device, "usedBytes": sample.used_bytes,
                 "peakBytes": sample.peak_bytes}
        if sample.reserved_bytes:
            shown["reservedBytes"] = sample.reserved_bytes
        self.latest[worker_id] = shown
        top = max(sample.peak_bytes, sample.used_bytes)
        if self.peak is None or top > self.peak["peakBytes"]:
            self.peak = {"peakBytes": top, "worker": worker_id, "step": sample.step, "device": sample.device}

    def of(self, worker_id: str) -> dict | None:
        return self.latest.get(worker_id)


__all__ = ["MemoryBook", "MicroBatchChoice"]
