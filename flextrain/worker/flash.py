"""Rank 0's side of in-memory ("flash") checkpoints (``--memory-checkpoint-steps``).

At a step boundary due for a snapshot the training thread does only this:
encode the state (the copy) and hand the bytes to a background writer thread.
It never waits for the writer nor the master.

The writer checks the weights for NaN/inf (such a snapshot is never kept) and
puts the state into the job's shared-memory directory
(:class:`flextrain.elastic.flash.FlashStore`) under a name that carries the
snapshot's exact position. It sends the master nothing: the master resolves
the snapshot on its own (``master/checkpoint_reports.py``), writing its ledger
beside it before its ledger records an outcome the snapshot's model may lack,
or removing it when it finds the ledger already moved past it
(``flextrain.master.accounting.moved_past``). Every ``persist_every``-th
snapshot (``--memory-checkpoint-persist-every``) is also persisted:
``ckpt-<version>.ckpt`` in the job directory (fsync, atomic rename, fsync of
the directory), reported with its position (``ReportCheckpoint(memory=True)``);
the master records it with the ledger it resolved for it, unless it refused it
or already holds a newer checkpoint. :meth:`FlashCheckpointer.close` persists
the newest snapshot not yet on disk (the worker is going away). Only the
newest waiting snapshot is written: one superseded while the writer was busy
is dropped. A blocking checkpoint (final, stop, ``--checkpoint-steps``) first
waits for the writer and drops the waiting one (it is newer than both).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from flextrain.elastic.flash import FlashStore
from flextrain.elastic.statecodec import Encoded, nonfinite_blob, nonfinite_encoded
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.checkpoints import checkpoint_path, write_checkpoint

log = logging.getLogger("flextrain.worker")

# How long close() tries to report the last persisted snapshot: the worker is exiting, the master may be gone.
CLOSE_GIVE_UP_S = 5.0


class FlashCheckpointer:
    def __init__(self, *, store: FlashStore, checkpoints: Path, client, every: int, persist_every: int = 1,
                 persist_seconds: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        """``every``: steps between snapshots; a complete one is written to ``checkpoints`` when it is at
        least the ``persist_every``-th since the last write and ``persist_seconds`` have passed since it
        (the rest live in shared memory only); ``clock``: seconds, for the time rule."""
        self.store = store
        self.checkpoints = Path(checkpoints)
        self.client = client
        self.every = every
        self.persist_every = max(1, persist_every)
        self.persist_seconds = max(0.0, persist_seconds)
        self.clock = clock
        self._disk_at = clock()  # the last write to disk (the start: the checkpoint resumed from, or nothing)
        self._cond = threading.Condition()
        self._queued: tuple[int, bytes, pb.Position] | None = None  # taken, for the writer
        self._unpersisted: tuple[int, bytes, pb.Position] | None = None  # in shared memory, not on disk
        self._since_disk = 0  # snapshots in shared memory since the last one persisted
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        # completed: in shared memory; dropped: superseded before the writer took it, or non-finite
        self.taken = self.completed = self.persisted = self.dropped = 0
        # What snapshots cost: the training thread's seconds (encode, copy, hand-over; wall, which holds
        # any preemption, and CPU) and the writer thread's CPU seconds; logged as JSON by close()
        # (bench/flash_checkpoint.py reads it).
        self.training_s = self.training_cpu_s = self.writer_cpu_s = 0.0

    def due(self, version: int) -> bool:
        return self.every > 0 and version > 0 and version % self.every == 0

    # ---- the training thread ----------------------------------------------------
    def snapshot(self, encode: Callable[[], bytes | Encoded], position: pb.Position) -> None:
        """Copy the state at ``position`` (``encode()``'s bytes, or ``statecodec.encode_indexed``'s
        result: the writer's check then reads its header as built); the writer puts it into shared memory."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        blob = encode()
        version = position.version
        job = (version, blob, pb.Position(round_id=position.round_id, task_index=position.task_index,
                                          steps_done=position.steps_done, version=version))
        with self._cond:
            if self._queued is not None:  # superseded before the writer got to it
                self.dropped += 1
            self._queued = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="flash-writer")
                self._thread.start()
            self._cond.notify_all()
        self.taken += 1
        self.training_s += time.perf_counter() - t0
        self.training_cpu_s += time.thread_time() - cpu0

    def drain(self, *, discard: bool = True) -> None:
        """Wait until the writer is idle. ``discard`` (a blocking checkpoint follows, newer than any
        snapshot): drop the waiting snapshot and forget the one not yet on disk."""
        with self._cond:
            if discard and self._queued is not None:
                self.dropped += 1
                self._queued = None
            while self._busy or self._queued is not None:
                self._cond.wait()
            if discard:  # a blocking checkpoint follows: it is the newest write to disk
                self._unpersisted, self._since_disk, self._disk_at = None, 0, self.clock()

    def close(self) -> None:
        """Wait for the writer's snapshot in progress, drop the waiting one, persist the newest snapshot
        not yet on disk."""
        with self._cond:
            self._closing = True
            if self._queued is not None:
                self.dropped += 1
                self._queued = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._unpersisted is not None:
            job, self._unpersisted = self._unpersisted, None
            self._timed(lambda: self._persist(*job, give_up=CLOSE_GIVE_UP_S), job[0])
        if self.taken:
            log.info("in-memory checkpoints: %s", json.dumps({
                "taken": self.taken, "completed": self.completed, "persisted": self.persisted,
                "dropped": self.dropped,
                "training_ms_each": round(self.training_s / self.taken * 1e3, 4),
                "training_cpu_ms_each": round(self.training_cpu_s / self.taken * 1e3, 4),
                "writer_cpu_ms_each": round(self.writer_cpu_s / self.taken * 1e3, 4)}))

    # ---- the writer thread ------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while self._queued is None and not self._closing:
                    self._cond.wait()
                if self._queued is None:
                    return
                job, self._queued = self._queued, None
                self._busy = True
            try:
                self._timed(lambda: self._complete(*job), job[0])
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _timed(self, work: Callable[[], None], version: int) -> None:
        cpu0 = time.thread_time()
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - a full disk, the master gone: the next snapshot tries again
            log.error("in-memory checkpoint of step %d not persisted: %s", version, exc)
        finally:
            self.writer_cpu_s += time.thread_time() - cpu0

    def _complete(self, version: int, blob: bytes | Encoded, position: pb.Position) -> None:
        """Put the snapshot into shared memory (the master resolves it from its name); persist it when
        it is due by count and by time (:meth:`_due_on_disk`)."""
        # never kept: a job must not resume with it (no CRC: encode() made these bytes in this process)
        if isinstance(blob, Encoded):
            bad, blob = nonfinite_encoded(blob), blob.data
        else:
            bad = nonfinite_blob(blob, checksum=False)
        if bad:
            with self._cond:
                self.dropped += 1
            log.error("in-memory checkpoint of step %d dropped: non-finite weights (%s)", version, "; ".join(bad))
            return
        self.store.put_state(blob, position)
        self.completed += 1
        self._since_disk += 1
        with self._cond:
            self._unpersisted = (version, blob, position)
            if not self._due_on_disk():
                return
            self._unpersisted, self._since_disk, self._disk_at = None, 0, self.clock()
        self._persist(version, blob, position)

    def _due_on_disk(self) -> bool:
        """At least ``persist_every`` complete snapshots and ``persist_seconds`` since the last write."""
        return self._since_disk >= self.persist_every and self.clock() - self._disk_at >= self.persist_seconds

    def _persist(self, version: int, blob: bytes, position: pb.Position, *, give_up: float | None = None) -> None:
        path = checkpoint_path(self.checkpoints, version)
        write_checkpoint(path, blob)
        self.client.report_checkpoint(str(path), position, final=False, memory=True, give_up=give_up)
        self.persisted += 1


__all__ = ["FlashCheckpointer"]
