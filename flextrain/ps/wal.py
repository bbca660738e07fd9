"""Write-ahead log of a PS shard: what a relaunched PS replays on top of its checkpoint.

Contract:

* Every state change the shard acknowledges (configure, init_dense, new
  tables, accepted push, flush) is queued here *under the shard lock, in the
  order it is applied*, and answered only once written (``ShardState.wal``).
  So after a crash the newest checkpoint plus the log reproduces every
  acknowledged change, in the original order, through the same code paths
  (same updates, same versions, same minibatch bookkeeping); a change whose
  record did not make it to the log was never acknowledged, and its client
  retries it. Each record gets the next log sequence number (LSN); a
  checkpoint names the last LSN its state includes (``wal_lsn``), and replay
  (:mod:`flextrain.ps.walreplay`) applies the records after it.
* Group commit: a writer thread takes every record queued meanwhile and
  writes them together (one ``pwritev`` series, with ``fsync=True`` one
  fdatasync), so the shard lock is never held across a disk write or any
  other file operation, pulls never wait for one, and N concurrent pushes
  cost one write instead of N. Gradients are written as the shard holds them
  (its dtypes, from the received buffers, no copy) and uncompressed: float
  gradients barely compress (lz4 1.00, zstd-1 0.92 of the size on
  normal-distributed float32) at 2-5x the cost of writing them (bench/README.md).
* Durability: a record is written with ``pwritev(2)`` before the answer, so
  it survives the death of the PS *process* (SIGKILL, OOM, a crashed pod on
  the same volume). With ``fsync=True`` each batch is also flushed to the
  device before its pushes are answered, which makes them survive the loss of
  the machine too, at the cost of one disk flush per batch (not per push).
* Files (:mod:`flextrain.ps.walfiles`): fixed-size segments ``wal-<n>.log``,
  allocated ahead by a helper thread and recycled once no kept checkpoint
  needs them (:meth:`WriteAheadLog.recycle`), so the writer overwrites
  allocated blocks instead of appending to new files. Records carry their LSN
  and segment number under their CRC, so a recycled file's old records never
  pass for new ones. A restarted PS never writes into a segment it replayed:
  it replays, then starts a segment numbered above every file there.

Nothing here unpickles: heads are JSON, tensors raw little-endian bytes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from flextrain.ps.dense import Spec
from flextrain.ps.embedding import TableSpec
from flextrain.ps.walfiles import (FRAME, HEAD, SEGMENT_BYTES, SPARES, SegmentFile, SegmentPool, frame,
                                   name_thread, segments, stop_thread)

log = logging.getLogger(__name__)
CONFIGURE, INIT_DENSE, TABLES, PUSH, FLUSH = 1, 2, 3, 4, 5


def _bytes_of(t: torch.Tensor) -> memoryview:
    t = t.contiguous()
    return memoryview(t.view(torch.uint8).numpy() if t.dtype != torch.bfloat16 else
                      t.view(torch.int16).view(torch.uint8).numpy()).cast("B")


class WALError(OSError):
    """The log could not be written: nothing from this point on can be acknowledged (restart the PS)."""


class WriteAheadLog:
    """Appends records to the log's segments through a writer thread, with group commit.

    ``log_*`` (called under the shard lock) only queue a record and return its
    LSN; they never touch the disk, so the shard lock is not held across a
    write. The writer thread takes everything queued, writes it with as few
    ``pwritev`` calls as it takes (and, with ``fsync``, one fdatasync for the
    lot), then marks those LSNs durable and wakes their waiters: :meth:`wait`
    returns once a record is written, and the shard answers its client only
    then. So many concurrent pushes share one write (and one flush): the batch
    is whatever arrived while the previous one was being written. Blobs are
    queued by reference: their owners must not change them until written
    (``after`` callbacks run then: the shard recycles the gradient buffers
    there). A record that does not fit in what is left of the segment starts
    the next one (``segment_bytes``; a helper thread keeps ``spares`` allocated).

    A failed write (full disk...) makes the log fail-stop: that record and every
    later one are never acknowledged (:class:`WALError`), since the in-memory
    state may already hold the change; a restarted PS replays what was written.
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = False,
                 opener: Callable[[Path], object] = SegmentFile, segment_bytes: int = SEGMENT_BYTES,
                 spares: int = SPARES) -> None:
        self.dir = Path(directory)
        self.fsync = fsync
        self.batches = 0          # writes: one per group commit (diagnostics and tests)
        self.records = 0          # records written
        self.pool = SegmentPool(self.dir, segment_bytes=segment_bytes, spares=spares, fsync=fsync)
        self._opener = opener
        self._cond = threading.Condition()
        self._queue: list = []    # (lsn, kind, prefix, blobs, after) records
        self._appended = 0        # LSN of the last record queued
        self._durable = 0         # every LSN up to this one is written (and fsynced with fsync)
        self._last: dict[int, int] = {}  # segment number -> LSN of its last record (known to this process)
        self._writing = -1        # segment number the writer thread writes to
        self._file = None
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def open_segment(self, number: int, *, lsn: int = 0, known: dict[int, int] | None = None) -> int:
        """Start logging into segment ``number`` (a number above every segment written before); the next
        record gets LSN ``lsn + 1``. ``known``: segment number -> last LSN of the segments already there."""
        with self._cond:
            if self._thread is not None:
                raise RuntimeError(f"write-ahead log {self.dir} is already open")
            self._check()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pool.current = number
        self._file = self._opener(self.pool.prepare(number))
        with self._cond:
            self._writing = number
            self._appended = self._durable = lsn
            self._last.update(known or {})
            self._thread = threading.Thread(target=self._writer, name="ps-wal", daemon=True)
            self._thread.start()
        self.pool.start(number)
        return number

    @property
    def number(self) -> int:
        """The segment being written (-1: not open)."""
        return self._writing

    @property
    def appended(self) -> int:
        """LSN of the last record queued (wait for it to cover every change made so far)."""
        return self._appended

    def wait(self, lsn: int, timeout: float | None = None) -> None:
        """Return once record ``lsn`` (and all before it) is written; WALError if it never will be."""
        with self._cond:
            self._cond.wait_for(lambda: self._durable >= lsn or self._error is not None, timeout=timeout)
            if self._durable < lsn:
                if self._error is not None:
                    raise WALError(f"write-ahead log {self.dir} failed: {self._error}") from self._error
                raise TimeoutError(f"write-ahead log {self.dir}: record {lsn} not written after {timeout} s")

    def wait_queued(self, count: int, timeout: float | None = None) -> bool:
        """Block until at least ``count`` records wait for the writer (tests and diagnostics)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._queue) >= count, timeout=timeout)

    def close(self) -> None:
        """Write what is queued, stop the writer and helper threads, close the segment."""
        stop_thread(self)
        self.pool.close()

    def recycle(self, keep_after: int) -> None:
        """Recycle the segments whose records all have LSNs ``<= keep_after`` (the oldest kept checkpoint
        holds them), and those holding none, except the one being written."""
        with self._cond:
            writing, last = self._writing, dict(self._last)
        self.pool.recycle([(n, p) for n, p in segments(self.dir) if n < writing and last.get(n, 0) <= keep_after])

    def discard(self, old: list[tuple[int, Path]]) -> None:
        """Recycle segments whose records replay left out (after a break in the log): never replay them."""
        with self._cond:
            for n, _ in old:
                self._last.pop(n, None)
        self.pool.recycle(old)

    # ---------------------------------------------------------------- the writer thread

    def _check(self) -> None:
        if self._error is not None:
            raise WALError(f"write-ahead log {self.dir} failed: {self._error}") from self._error
        if self._closed:
            raise WALError(f"write-ahead log {self.dir} is closed")

    def _writer(self) -> None:
        name_thread("ps-wal")
        file, number, used = self._file, self._writing, 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:  # closed and drained
                    break
                batch, self._queue = self._queue, []
            views: list = []
            last, count, after, placed = None, 0, [], {}
            try:
                for lsn, kind, prefix, blobs, done in batch:
                    size = FRAME.size + len(prefix) + sum(len(b) for b in blobs)
                    if used and used + size > self.pool.segment_bytes:  # full: on to the next segment
                        self._write_all(file, views)
                        views = []
                        if self.fsync:
                            file.sync()
                        file.release()
                        file.close()
                        file = None
                        done_with, (number, path) = number, self.pool.advance()
                        file, used = self._opener(path), 0
                        with self._cond:  # together: recycle() must never see the old segment unfinished
                            if done_with in placed:
                                self._last[done_with] = placed[done_with]
                            self._writing = number
                    views += [frame(lsn, number, prefix, blobs), prefix, *blobs]
                    used += size
                    placed[number] = lsn
                    last, count = lsn, count + 1
                    if done is not None:
                        after.append(done)
                if views:
                    self._write_all(file, views)
                    if self.fsync:
                        file.sync()
                    self.pool.note_used(used)
            except BaseException as exc:  # fail-stop: nothing queued from here on is acknowledged
                log.error("PS write-ahead log %s: write failed (%s); no further change can be acknowledged "
                          "until the PS restarts", self.dir, exc)
                with self._cond:
                    self._error = exc
                    self._queue = []
                    self._cond.notify_all()
                if file is not None:
                    file.close()
                return
            with self._cond:
                if last is not None:
                    self._durable = last
                    self._last.update(placed)
                    self.batches += 1
                    self.records += count
                self._cond.notify_all()
            for done in after:
                done()
            file.release()  # after the answers: the page cache's bookkeeping, not durability
        if self.fsync:
            file.sync()
        file.close()

    @staticmethod
    def _write_all(file, parts: list) -> None:
        views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]  # writev of only empties: 0
        while views:
            written = file.writev(views[:1024])
            if written == 0:  # would spin forever (full device, a closed pipe...): fail the update
                raise OSError("write made no progress")
            while written and views:
                if written >= len(views[0]):
                    written -= len(views.pop(0))
                else:
                    views[0], written = views[0][written:], 0

    # ---------------------------------------------------------------- records

    def _append(self, kind: int, head: dict, blobs: list, after: Callable[[], None] | None = None) -> int:
        """Queue one record (under the shard lock); returns its LSN. Framing and checksums are the writer's work."""
        blobs = [memoryview(b).cast("B") for b in blobs]
        head_bytes = json.dumps({**head, "blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
        prefix = HEAD.pack(kind, len(head_bytes)) + head_bytes
        with self._cond:
            self._check()
            if self._thread is None:
                raise RuntimeError("write-ahead log is not open")
            self._appended += 1
            self._queue.append((self._appended, kind, prefix, blobs, after))
            self._cond.notify_all()
            return self._appended

    def log_configure(self, optimizer: tuple[str, dict] | None, sync) -> int:
        return self._append(CONFIGURE, {"optimizer": list(optimizer) if optimizer else None,
                                 "sync": asdict(sync) if sync is not None else None}, [])

    def log_init_dense(self, specs: list[Spec], data) -> int:
        return self._append(INIT_DENSE, {"specs": [[s.name, s.dtype, list(s.shape)] for s in specs]}, [data])

    def log_tables(self, specs: list[TableSpec]) -> int:
        return self._append(TABLES, {"tables": [s.to_dict() for s in specs]}, [])

    def log_flush(self) -> int:
        return self._append(FLUSH, {}, [])

    def log_push(self, client_id: str, seq: int, base: int, step, grads, absent: set[str], sparse: dict,
                 after: Callable[[], None] | None = None) -> int:
        """Queue an accepted push: the gradients as they are held (the shard's dtypes, no copy)."""
        blobs: list = []
        if grads is not None:
            blobs.append(_bytes_of(grads.buffer))
        tables = []
        for name, (ids, values) in sparse.items():
            ids = np.ascontiguousarray(ids, dtype="<i8")
            blobs += [memoryview(ids).cast("B"), _bytes_of(values)]
            tables.append([name, len(ids), int(values.shape[1]), str(values.dtype).removeprefix("torch.")])
        return self._append(PUSH, {"client": client_id, "seq": seq, "base": base,
                                   "step": list(step) if step else None,
                                   "dense": len(blobs[0]) if grads is not None else -1, "absent": sorted(absent),
                                   "sparse": tables}, blobs, after)
