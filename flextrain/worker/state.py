"""WorkerState: where a worker stands, written by its training thread and read by its heartbeat thread."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from flextrain.elastic.memory import MemoryMonitor
from flextrain.proto import flextrain_pb2 as pb


class Traffic:
    """Pushes and pulls as this worker timed them, added up until the next heartbeat takes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums = pb.PSTraffic()

    def add(self, *, pull: bool, seconds: float, nbytes: int) -> None:
        with self._lock:
            s = self._sums
            if pull:
                s.pulls, s.pull_seconds, s.pull_bytes = s.pulls + 1, s.pull_seconds + seconds, s.pull_bytes + nbytes
            else:
                s.pushes, s.push_seconds, s.push_bytes = s.pushes + 1, s.push_seconds + seconds, s.push_bytes + nbytes

    def take(self) -> pb.PSTraffic | None:
        """The sums since the last call (None: no call since)."""
        with self._lock:
            taken, self._sums = self._sums, pb.PSTraffic()
        return taken if taken.pushes or taken.pulls else None


@dataclass
class WorkerState:
    """What the heartbeat thread reports; written by the training thread."""

    round_id: int = -1
    task_index: int = 0
    steps_done: int = 0
    version: int = 0
    synced: bool = False  # this model is round_id's lockstep state (its state sync finished)
    loss_sum: float = 0.0
    loss_samples: int = 0
    compute_seconds: float = 0.0  # outside any wait for peers, since the last heartbeat (the straggler figure)
    compute_samples: int = 0
    waiting: bool = False  # blocked on peers: a collective or the rendezvous
    in_rendezvous: bool = False  # ... and of those, the rendezvous (an RPC, not a collective)
    progressed: float = field(default_factory=time.monotonic)
    step_seconds: float = 0.0  # moving average of the time between progress marks
    skipped_steps: int = 0  # steps dropped for a non-finite loss or gradient (--nan-policy skip-step)
    lr_factor: float = 0.0  # --lr-rule adascale: the last step's gain (0: none measured yet)
    noise_scale: float | None = None  # ... and the gradient noise scale (None: no estimate yet)
    # Samples this process's memory for each heartbeat (sample_memory); None: not sampled.
    monitor: MemoryMonitor | None = None
    traffic: Traffic = field(default_factory=Traffic)  # ParameterServer: pushes and pulls since the last heartbeat
    end_round: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rounds = threading.Condition(self.lock)  # notified when the worker adopts a round

    def adopt_round(self, round_id: int) -> None:
        """The training thread enters ``round_id`` (not in sync in it yet); an ``end_round`` seen for the
        round left is dropped in the same step, so it cannot end the new one."""
        with self._rounds:
            self.end_round.clear()
            self.round_id, self.task_index, self.steps_done, self.synced = round_id, 0, 0, False
            self._rounds.notify_all()

    def round_ended(self, round_id: int) -> None:
        """The master says ``round_id`` ended: end it here at the next step boundary, if we are still in it."""
        with self._rounds:
            if self.round_id == round_id:
                self.end_round.set()

    def wait_round_after(self, round_id: int, timeout: float, *, until=lambda: False) -> bool:
        """Wait up to ``timeout`` seconds for a round other than ``round_id``, or ``until()`` (looked at
        again when :meth:`nudge` is called); True once either holds."""
        with self._rounds:
            return self._rounds.wait_for(lambda: self.round_id != round_id or until(), timeout)

    def nudge(self) -> None:
        """Have :meth:`wait_round_after` look at its ``until`` again."""
        with self._rounds:
            self._rounds.notify_all()

    def position(self) -> pb.Position:
        return pb.Position(round_id=self.round_id, task_index=self.task_index,
                           steps_done=self.steps_done, version=self.version, lr_gain=self.lr_factor,
                           gradient_noise_scale=self.noise_scale, synced=self.synced)

    def mark_progress(self) -> None:
        now = time.monotonic()
        took, self.progressed = now - self.progressed, now
        self.step_seconds = took if not self.step_seconds else 0.9 * self.step_seconds + 0.1 * took

    def add_loss(self, loss_sum: float, samples: int) -> None:
        with self.lock:
            self.loss_sum += loss_sum
            self.loss_samples += samples

    def take_loss(self) -> tuple[float, int]:
        with self.lock:
            n, s = self.loss_samples, self.loss_sum
            self.loss_sum, self.loss_samples = 0.0, 0
        return (s / n if n else math.nan), n

    def add_compute(self, seconds: float, samples: int) -> None:
        """A step's own work (reading, forward, loss, backward; not its wait for peers) on ``samples``."""
        if samples > 0:
            with self.lock:
                self.compute_seconds += seconds
                self.compute_samples += samples

    def take_compute(self) -> tuple[float, int]:
        with self.lock:
            taken = self.compute_seconds, self.compute_samples
            self.compute_seconds, self.compute_samples = 0.0, 0
        return taken

    def sample_memory(self) -> pb.MemorySample | None:
        """The monitor's sample of this process's memory now, for a heartbeat (None: no monitor, or no
        step trained yet). Taken when a heartbeat is sent, not after every step (a /proc read is tens of
        microseconds, a per-step cost the sample does not need): the peaks it reports (VmHWM; CUDA's
        peak since the previous sample) already cover every step in between."""
        if self.monitor is None or self.version == 0:
            return None
        return memory_sample(self.monitor.record(self.version), self.monitor.device)


def memory_sample(entry: dict, device) -> pb.MemorySample:
    """A :meth:`MemoryMonitor.record` entry as the heartbeat carries it: on the CPU the resident set and
    its high-water mark; on CUDA the bytes allocated to tensors, the most since the last sample, and
    what the caching allocator holds."""
    if device.type == "cuda":
        return pb.MemorySample(step=entry["step"], device=str(device), used_bytes=entry["allocated"],
                               peak_bytes=entry["peak"], reserved_bytes=entry["reserved"])
    rss = entry.get("rss", 0)
    return pb.MemorySample(step=entry["step"], device=str(device), used_bytes=rss,
                           peak_bytes=entry.get("peak_rss", rss))


__all__ = ["WorkerState", "memory_sample"]
