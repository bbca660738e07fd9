"""Rank 0's side of in-memory ("flash") checkpoints (``--memory-checkpoint-steps``).

At a step boundary due for a snapshot the training thread does only this:
encode the state (the copy) into the job's shared-memory directory
(:class:`flextrain.elastic.flash.FlashStore`) and send the master a *mark* with
the exact position (an asynchronous ``ReportCheckpoint(memory=True)``). The
master answers with the ledger state of exactly that model.

Consistency: the master computes that ledger from its current ledger
(``ledger_at``), which is right only while the round has not gone past the
snapshot's task. Nobody can: the next step needs rank 0 in its reduction, and
rank 0 waits for the mark's answer (:meth:`FlashCheckpointer.settle`) before
that reduction, before any other RPC that carries a later position (the next
``GetTask``, a rendezvous join) and before a blocking checkpoint. The answer
normally arrives while the next step computes, so the wait costs nothing.

The answered snapshot goes to a background thread, which writes the ledger
beside the state in shared memory (the snapshot is then complete: a master
can flush it alone), writes ``ckpt-<version>.ckpt`` to the job directory
(fsync, atomic rename, fsync of the directory) and reports it with that
ledger; the master records it unless it already holds a newer checkpoint.
Only the newest waiting snapshot is written: one superseded while the thread
was busy is dropped. A blocking checkpoint (final, stop, ``--checkpoint-steps``)
first waits for the write in progress and drops the waiting one.
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
from flextrain.elastic.statecodec import decode, nonfinite
from flextrain.proto import flextrain_pb2 as pb

log = logging.getLogger("flextrain.worker")


def _position(p: pb.Position) -> dict:
    return {"round_id": p.round_id, "task_index": p.task_index, "steps_done": p.steps_done, "version": p.version}


class FlashCheckpointer:
    def __init__(self, *, store: FlashStore, checkpoints: Path, client, every: int) -> None:
        self.store = store
        self.checkpoints = Path(checkpoints)
        self.client = client
        self.every = every
        self._mark: tuple[int, bytes, pb.Position, grpc.Future] | None = None  # waiting for its ledger
        self._cond = threading.Condition()
        self._queued: tuple[int, bytes, pb.Position, str] | None = None  # for the writer
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self.taken = self.persisted = self.dropped = 0
        # What snapshots cost: the training thread's seconds (encode, copy, mark, waiting for the answer)
        # and the writer thread's CPU seconds; logged as JSON by close() (bench/flash_checkpoint.py reads it).
        self.training_s = self.writer_cpu_s = 0.0

    def due(self, version: int) -> bool:
        return self.every > 0 and version > 0 and version % self.every == 0

    # ---- the training thread ----------------------------------------------------
    def snapshot(self, encode: Callable[[], bytes], position: pb.Position) -> None:
        """Copy the state at ``position`` (``encode()``'s bytes) into shared memory and mark it."""
        self.settle()
        t0 = time.perf_counter()
        blob = encode()
        version = position.version
        self.store.put_state(version, blob)
        self._mark = (version, blob, pb.Position(round_id=position.round_id, task_index=position.task_index,
                                                 steps_done=position.steps_done, version=version),
                      self.client.mark_snapshot(position))
        self.taken += 1
        self.training_s += time.perf_counter() - t0

    def settle(self) -> None:
        """Wait for the pending mark's answer (see the module docstring) and pass the snapshot on."""
        if self._mark is None:
            return
        version, blob, position, future = self._mark
        self._mark = None
        t0 = time.perf_counter()
        try:
            ledger_json = future.result().ledger_json
        except grpc.RpcError as exc:  # e.g. the master restarting: the next snapshot is marked anew
            log.warning("in-memory checkpoint of step %d not persisted: its mark failed (%s)", version, exc.code())
            ledger_json = ""
        self.training_s += time.perf_counter() - t0
        if not ledger_json:
            self.dropped += 1
            self.store.state_path(version).unlink(missing_ok=True)  # never usable without its ledger
            return
        with self._cond:
            if self._queued is not None:
                self.dropped += 1
            self._queued = (version, blob, position, ledger_json)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="flash-writer")
                self._thread.start()
            self._cond.notify_all()

    def drain(self, *, discard: bool = True) -> None:
        """Settle, drop the waiting snapshot (``discard``), and wait until no write is in progress."""
        self.settle()
        with self._cond:
            if discard and self._queued is not None:
                self._queued = None
                self.dropped += 1
            while self._busy or self._queued is not None:
                self._cond.wait()

    def close(self) -> None:
        """Wait for a write in progress (a half-written checkpoint file helps nobody), drop the rest."""
        self._mark = None
        with self._cond:
            self._closing, self._queued = True, None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self.taken:
            log.info("in-memory checkpoints: %s", json.dumps({
                "taken": self.taken, "persisted": self.persisted, "dropped": self.dropped,
                "training_ms_each": round(self.training_s / self.taken * 1e3, 4),
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
            cpu0 = time.thread_time()
            try:
                self._persist(*job)
            except Exception as exc:  # noqa: BLE001 - a full disk, the master gone: the next snapshot tries again
                log.error("in-memory checkpoint of step %d not persisted: %s", job[0], exc)
            finally:
                self.writer_cpu_s += time.thread_time() - cpu0
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _persist(self, version: int, blob: bytes, position: pb.Position, ledger_json: str) -> None:
        if bad := nonfinite(decode(blob)["model"]):  # never kept: a job must not resume with it
            self.store.state_path(version).unlink(missing_ok=True)
            log.error("in-memory checkpoint of step %d dropped: non-finite weights (%s)", version, "; ".join(bad))
            return
        self.store.put_ledger(version, blob, ledger=json.loads(ledger_json), position=_position(position))
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        path = self.checkpoints / f"ckpt-{version:09d}.ckpt"
        write_atomic(path, blob)
        self.client.report_checkpoint(str(path), position, final=False, ledger_json=ledger_json)
        self.persisted += 1


__all__ = ["FlashCheckpointer"]
