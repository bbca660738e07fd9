"""Rank 0's side of in-memory ("flash") checkpoints (``--memory-checkpoint-steps``).

At a step boundary due for a snapshot the training thread does only this:
encode the state (the copy) and hand the bytes to a background writer thread.
It never waits for the writer nor the master.

The writer puts the state into the job's shared-memory directory
(:class:`flextrain.elastic.flash.FlashStore`), sends the master a *mark* with
the snapshot's exact position (a ``ReportCheckpoint(memory=True)``) and waits
for its answer: the ledger state of exactly that model, or "" when the master
can no longer tell. The round
goes on meanwhile, so the master checks that its ledger holds nothing the
snapshot's model lacks (``flextrain.master.accounting.moved_past``: the
snapshot's task completed while the model is inside it or failed at a later
step, a later task done or failed with steps applied, a round formed past the
snapshot's step) and answers "" then: such a snapshot is dropped, never
recorded with a wrong position.

An answered snapshot is complete in memory: the writer writes its ledger
beside the state (a master can flush it alone). Every ``persist_every``-th
complete snapshot (``--memory-checkpoint-persist-every``) is also persisted:
``ckpt-<version>.ckpt`` in the job directory (fsync, atomic rename, fsync of
the directory), reported with that ledger; the master records it unless it
already holds a newer checkpoint. :meth:`FlashCheckpointer.close` persists the
newest complete snapshot not yet on disk (the worker is going away). Only the
newest waiting snapshot is marked: one superseded while the writer was busy is
dropped. A blocking checkpoint (final, stop, ``--checkpoint-steps``) first
waits for the writer and drops the waiting one (it is newer than both).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

import grpc

from flextrain.durable import write_atomic
from flextrain.elastic.flash import FlashStore
from flextrain.elastic.statecodec import nonfinite_blob
from flextrain.proto import flextrain_pb2 as pb

log = logging.getLogger("flextrain.worker")

# How long close() tries to report the last persisted snapshot: the worker is exiting, the master may be gone.
CLOSE_GIVE_UP_S = 5.0


def _position(p: pb.Position) -> dict:
    return {"round_id": p.round_id, "task_index": p.task_index, "steps_done": p.steps_done, "version": p.version}


class FlashCheckpointer:
    def __init__(self, *, store: FlashStore, checkpoints: Path, client, every: int, persist_every: int = 1) -> None:
        """``every``: steps between snapshots; ``persist_every``: every how many complete snapshots one
        is written to ``checkpoints`` (the rest live in shared memory only)."""
        self.store = store
        self.checkpoints = Path(checkpoints)
        self.client = client
        self.every = every
        self.persist_every = max(1, persist_every)
        self._cond = threading.Condition()
        self._queued: tuple[int, bytes, pb.Position] | None = None  # taken, for the writer to mark
        self._unpersisted: tuple[int, bytes, pb.Position, str] | None = None  # complete, not on disk
        self._since_disk = 0  # complete snapshots since the last one persisted
        self._newest: tuple[int, bytes, pb.Position] | None = None  # the newest snapshot taken
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        # refused: dropped because the master answered the mark with "" (or not at all)
        self.taken = self.completed = self.persisted = self.dropped = self.refused = 0
        # What snapshots cost: the training thread's seconds (encode, copy, hand-over; wall, which holds
        # any preemption, and CPU) and the writer thread's CPU seconds; logged as JSON by close()
        # (bench/flash_checkpoint.py reads it).
        self.training_s = self.training_cpu_s = self.writer_cpu_s = 0.0

    def due(self, version: int) -> bool:
        return self.every > 0 and version > 0 and version % self.every == 0

    # ---- the training thread ----------------------------------------------------
    def snapshot(self, encode: Callable[[], bytes], position: pb.Position) -> None:
        """Copy the state at ``position`` (``encode()``'s bytes); the writer puts it into shared memory
        and marks it."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        blob = encode()
        version = position.version
        job = (version, blob, pb.Position(round_id=position.round_id, task_index=position.task_index,
                                          steps_done=position.steps_done, version=version))
        with self._cond:
            self._newest = job
            if self._queued is not None:  # superseded before the writer got to it
                self._drop(*self._queued[:2])
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
                self._drop(*self._queued[:2])
                self._queued = None
            while self._busy or self._queued is not None:
                self._cond.wait()
            if discard:
                self._unpersisted = None

    def close(self) -> None:
        """Wait for the writer's snapshot in progress, drop the waiting one (marking it could wait on a
        master that is gone), persist the newest complete snapshot not yet on disk."""
        with self._cond:
            self._closing = True
            if self._queued is not None:
                self._drop(*self._queued[:2])
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
                "dropped": self.dropped, "refused": self.refused,
                "training_ms_each": round(self.training_s / self.taken * 1e3, 4),
                "training_cpu_ms_each": round(self.training_cpu_s / self.taken * 1e3, 4),
                "writer_cpu_ms_each": round(self.writer_cpu_s / self.taken * 1e3, 4)}))

    def _drop(self, version: int, blob: bytes) -> None:
        """A snapshot that will never be complete: its state goes (the caller holds the lock), unless a newer
        snapshot of the same version (the round rolled back and came this far again) wrote that file since."""
        self.dropped += 1
        if self._newest is None or self._newest[0] != version or self._newest[1] is blob:
            self.store.state_path(version).unlink(missing_ok=True)

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

    def _complete(self, version: int, blob: bytes, position: pb.Position) -> None:
        """Put the snapshot into shared memory and mark it, write its ledger beside it; persist it when
        it is the ``persist_every``-th."""
        if self._newest is not None and self._newest[0] == version and self._newest[1] is not blob:
            with self._cond:  # a newer snapshot of this version was taken meanwhile (see _drop)
                self._drop(version, blob)
            return
        self.store.put_state(version, blob)
        try:
            ledger_json = self.client.mark_snapshot(position)
        except grpc.RpcError as exc:  # e.g. the master restarting: the next snapshot is marked anew
            log.warning("in-memory checkpoint of step %d dropped: its mark failed (%s)", version, exc.code())
            ledger_json = ""
        if not ledger_json:  # the round went past it before the master answered, or the master cannot tell
            with self._cond:
                self.refused += 1
                self._drop(version, blob)
            return
        if bad := nonfinite_blob(blob):  # never kept: a job must not resume with it
            with self._cond:
                self._drop(version, blob)
            log.error("in-memory checkpoint of step %d dropped: non-finite weights (%s)", version, "; ".join(bad))
            return
        self.store.put_ledger(version, blob, ledger=json.loads(ledger_json), position=_position(position))
        self.completed += 1
        self._since_disk += 1
        with self._cond:
            self._unpersisted = (version, blob, position, ledger_json)
            if self._since_disk < self.persist_every:
                return
            self._unpersisted, self._since_disk = None, 0
        self._persist(version, blob, position, ledger_json)

    def _persist(self, version: int, blob: bytes, position: pb.Position, ledger_json: str, *,
                 give_up: float | None = None) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        path = self.checkpoints / f"ckpt-{version:09d}.ckpt"
        write_atomic(path, blob)
        self.client.report_checkpoint(str(path), position, final=False, ledger_json=ledger_json, give_up=give_up)
        self.persisted += 1


__all__ = ["FlashCheckpointer"]
