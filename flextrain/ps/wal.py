"""Write-ahead log of a PS shard: what a relaunched PS replays on top of its checkpoint.

Contract:

* Every state change the shard acknowledges (configure, init_dense, new
  tables, accepted push, flush) is queued here *under the shard lock, in the
  order it is applied*, and answered only once written (``ShardState.wal``).
  So after a crash the newest checkpoint plus the log reproduces every
  acknowledged change, in the original order, through the same code paths
  (same updates, same versions, same minibatch bookkeeping); a change whose
  record did not make it to the log was never acknowledged, and its client
  retries it.
* Group commit: a writer thread takes every record queued meanwhile and
  writes them together (one ``writev`` series, with ``fsync=True`` one
  fdatasync), so the shard lock is never held across a disk write, pulls never
  wait for one, and N concurrent pushes cost one write instead of N.
  Gradients are written as the shard holds them (its dtypes, from the received
  buffers, no copy) and uncompressed: float gradients barely compress (lz4
  1.00, zstd-1 0.92 of the size on normal-distributed float32) at 2-5x the
  cost of writing them (bench/README.md).
* Durability: a record is written with ``write(2)`` before the answer, so it
  survives the death of the PS *process* (SIGKILL, OOM, a crashed pod on the
  same volume). With ``fsync=True`` each batch is also flushed to the device
  before its pushes are answered, which makes them survive the loss of the
  machine too, at the cost of one disk flush per batch (not per push).
* Files: ``<dir>/wal-<n>.log`` segments. The checkpointer starts a new segment
  at every checkpoint snapshot (under the same lock, so segment ``n`` holds
  exactly the changes after the checkpoint that names ``wal_next = n``) and
  deletes the segments no kept checkpoint needs. A restarted PS never appends
  to an old segment: it replays, then opens a fresh one.
* Framing: ``<u32 length><u32 crc32><u64 sum>`` + payload; payload = kind
  byte, u32 JSON head length, JSON head, raw blobs (their lengths in the head).
  The CRC-32 covers kind and head; the blobs (gradients: the bulk) are
  checked by a wrapping sum of their 64-bit words, 4x cheaper than CRC-32
  and enough to tell a record the process did not finish writing (a short
  or zero-filled tail) from a whole one. A torn or corrupt record ends its
  segment (it was never acknowledged); the segment is truncated there on replay.

Nothing here unpickles: heads are JSON, tensors raw little-endian bytes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import threading
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from flextrain.ps.dense import Spec
from flextrain.ps.embedding import TableSpec
from flextrain.ps.settings import SyncSettings

log = logging.getLogger(__name__)
_NAME = re.compile(r"^wal-(\d+)\.log$")
_FRAME = struct.Struct("<IIQ")
_HEAD = struct.Struct("<BI")
CONFIGURE, INIT_DENSE, TABLES, PUSH, FLUSH = 1, 2, 3, 4, 5


def _sum64(blob) -> int:
    """Wrapping sum of the little-endian 64-bit words of ``blob`` (a short tail counts as one word)."""
    view = memoryview(blob).cast("B")
    whole = len(view) // 8 * 8
    total = int(np.frombuffer(view[:whole], dtype="<u8").sum(dtype=np.uint64)) if whole else 0
    return (total + int.from_bytes(view[whole:], "little") + len(view)) & 0xFFFFFFFFFFFFFFFF


def segments(directory: Path) -> list[tuple[int, Path]]:
    """(number, path) of the log segments in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)))


def _bytes_of(t: torch.Tensor) -> memoryview:
    t = t.contiguous()
    return memoryview(t.view(torch.uint8).numpy() if t.dtype != torch.bfloat16 else
                      t.view(torch.int16).view(torch.uint8).numpy()).cast("B")


class WALError(OSError):
    """The log could not be written: nothing from this point on can be acknowledged (restart the PS)."""


class SegmentFile:
    """One open log segment: ``writev``, ``sync`` (fdatasync) and ``close`` over a file descriptor.

    The writer thread is its only user. Tests substitute their own file-like (same three methods)
    through ``WriteAheadLog(opener=...)``.
    """

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def writev(self, views: list) -> int:
        return os.writev(self.fd, views)

    def sync(self) -> None:
        (getattr(os, "fdatasync", None) or os.fsync)(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class _Segment:
    """Queue marker: records after it go to ``file`` (segment ``number``)."""

    __slots__ = ("number", "file")

    def __init__(self, number: int, file) -> None:
        self.number, self.file = number, file


class WriteAheadLog:
    """Appends records to the current segment through a writer thread, with group commit.

    ``log_*`` (called under the shard lock) only queue a record and return its
    log sequence number (LSN); they never touch the disk, so the shard lock is
    not held across a write. The writer thread takes everything queued, writes
    it with as few ``writev`` calls as it takes (and, with ``fsync``, one
    fdatasync for the lot), then marks those LSNs durable and wakes their
    waiters: :meth:`wait` returns once a record is written, and the shard
    answers its client only then. So many concurrent pushes share one write
    (and one flush): the batch is whatever arrived while the previous one was
    being written. Blobs are queued by reference: their owners must not change
    them until written (``after`` callbacks run then: the shard recycles the
    gradient buffers there).

    A failed write (full disk...) makes the log fail-stop: that record and every
    later one are never acknowledged (:class:`WALError`), since the in-memory
    state may already hold the change; a restarted PS replays what was written.
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = False,
                 opener: Callable[[Path], object] = SegmentFile) -> None:
        self.dir = Path(directory)
        self.fsync = fsync
        self.number = -1          # newest segment opened (records appended now go there)
        self.batches = 0          # writes: one per group commit (diagnostics and tests)
        self.records = 0          # records written
        self._opener = opener
        self._cond = threading.Condition()
        self._queue: list = []    # _Segment markers and (lsn, kind, prefix, blobs, after) records
        self._appended = 0        # LSN of the last record queued
        self._durable = 0         # every LSN up to this one is written (and fsynced with fsync)
        self._writing = -1        # segment number the writer thread writes to
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def open_segment(self, number: int) -> int:
        """Start a new segment ``number``: records appended from now on go there (the file is created now)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        file = self._opener(self.dir / f"wal-{number}.log")
        with self._cond:
            self._check()
            self._queue.append(_Segment(number, file))
            self.number = number
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="ps-wal", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return number

    def rotate(self) -> int:
        """Start the next segment; returns its number (call under the shard lock)."""
        return self.open_segment(self.number + 1)

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
            return self._cond.wait_for(lambda: sum(not isinstance(q, _Segment) for q in self._queue) >= count,
                                       timeout=timeout)

    def close(self) -> None:
        """Write what is queued, stop the writer thread, close the segment."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None

    def prune(self, keep_from: int) -> None:
        """Delete segments numbered below ``keep_from`` (no kept checkpoint needs them)."""
        with self._cond:
            writing = self._writing if self._writing >= 0 else self.number
        for n, path in segments(self.dir):
            if n < keep_from and n < writing:
                path.unlink(missing_ok=True)

    # ---------------------------------------------------------------- the writer thread

    def _check(self) -> None:
        if self._error is not None:
            raise WALError(f"write-ahead log {self.dir} failed: {self._error}") from self._error
        if self._closed:
            raise WALError(f"write-ahead log {self.dir} is closed")

    def _writer(self) -> None:
        file = None
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:  # closed and drained
                    break
                batch, self._queue = self._queue, []
            views: list = []
            last, count, after = None, 0, []
            try:
                for item in batch:
                    if isinstance(item, _Segment):
                        self._write_all(file, views)
                        views = []
                        if file is not None:
                            if self.fsync:
                                file.sync()
                            file.close()
                        file = item.file
                        if self.fsync:  # the new file's directory entry
                            fd = os.open(self.dir, os.O_RDONLY)
                            try:
                                os.fsync(fd)
                            finally:
                                os.close(fd)
                        with self._cond:
                            self._writing = item.number
                        continue
                    lsn, kind, prefix, blobs, done = item
                    total = 0
                    for blob in blobs:
                        total = (total + _sum64(blob)) & 0xFFFFFFFFFFFFFFFF
                    size = len(prefix) + sum(len(b) for b in blobs)
                    views += [_FRAME.pack(size, zlib.crc32(prefix), total), prefix, *blobs]
                    last, count = lsn, count + 1
                    if done is not None:
                        after.append(done)
                if views:
                    if file is None:
                        raise RuntimeError("write-ahead log is not open")
                    self._write_all(file, views)
                    if self.fsync:
                        file.sync()
            except BaseException as exc:  # fail-stop: nothing queued from here on is acknowledged
                log.error("PS write-ahead log %s: write failed (%s); no further change can be acknowledged "
                          "until the PS restarts", self.dir, exc)
                with self._cond:
                    self._error = exc
                    self._queue = []
                    self._cond.notify_all()
                return
            with self._cond:
                if last is not None:
                    self._durable = last
                    self.batches += 1
                    self.records += count
                self._cond.notify_all()
            for done in after:
                done()
        if file is not None:
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
        """Queue one record (under the shard lock); returns its LSN. Checksums are the writer's work."""
        blobs = [memoryview(b).cast("B") for b in blobs]
        head_bytes = json.dumps({**head, "blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
        prefix = _HEAD.pack(kind, len(head_bytes)) + head_bytes
        with self._cond:
            self._check()
            if self.number < 0:
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


def read_records(path: Path) -> tuple[list[tuple[int, dict, memoryview]], int]:
    """The intact records of a segment and the byte length they span (a torn tail is left out)."""
    data = memoryview(path.read_bytes())
    records, pos = [], 0
    while pos + _FRAME.size <= len(data):
        size, crc, total = _FRAME.unpack_from(data, pos)
        body = data[pos + _FRAME.size: pos + _FRAME.size + size]
        if len(body) != size or size < _HEAD.size:
            break
        kind, head_len = _HEAD.unpack_from(body)
        if _HEAD.size + head_len > size or zlib.crc32(body[: _HEAD.size + head_len]) != crc:
            break
        try:
            head = json.loads(bytes(body[_HEAD.size: _HEAD.size + head_len]))
            lengths = [int(n) for n in head["blobs"]]
        except (ValueError, KeyError, TypeError):
            break
        blobs, at, check = body[_HEAD.size + head_len:], 0, 0
        if sum(lengths) != len(blobs):
            break
        for n in lengths:
            check = (check + _sum64(blobs[at: at + n])) & 0xFFFFFFFFFFFFFFFF
            at += n
        if check != total:
            break
        records.append((kind, head, blobs))
        pos += _FRAME.size + size
    return records, pos


def _replay_push(shard, head: dict, blobs: memoryview) -> None:
    pos, grads = 0, None
    if head["dense"] >= 0:
        if shard.dense is None or head["dense"] != shard.dense.total_bytes:
            raise ValueError("logged dense gradient does not fit the dense parameters")
        grads = shard.dense.wrap(bytearray(blobs[: head["dense"]]))
        pos = head["dense"]
    absent = set(head["absent"])
    sparse = {}
    for name, n, dim, dtype in head["sparse"]:
        ids = np.frombuffer(blobs[pos: pos + 8 * n], dtype="<i8").astype(np.int64)
        pos += 8 * n
        tdtype = getattr(torch, dtype)
        nbytes = n * dim * tdtype.itemsize
        values = torch.frombuffer(bytearray(blobs[pos: pos + nbytes]), dtype=tdtype).reshape(n, dim) if n else \
            torch.zeros((0, dim), dtype=tdtype)
        pos += nbytes
        shard.table(name)  # ValueError for an unknown table
        sparse[name] = (ids, values)
    step = tuple(head["step"]) if head["step"] else None
    with shard._cond:
        result = shard._admit(head["client"], head["seq"], head["base"], step, grads, absent, sparse, log=False)
    if not result.accepted or result.duplicate:
        log.warning("replayed push %s/%s was %s on replay", head["client"], head["seq"],
                    "a duplicate" if result.duplicate else f"rejected ({result.message})")


def replay(shard, directory: str | os.PathLike, *, start: int) -> tuple[int, int]:
    """Apply segments ``>= start`` of ``directory`` to ``shard`` in order; (records replayed, last segment).

    Torn tails are truncated. Returns ``(0, start - 1)`` when there is nothing to replay.
    """
    count, last = 0, start - 1
    for number, path in segments(Path(directory)):
        if number < start:
            continue
        last = number
        records, good = read_records(path)
        if good != path.stat().st_size:
            log.warning("PS write-ahead log %s: dropping a torn record after byte %d (never acknowledged)",
                        path, good)
            os.truncate(path, good)
        for kind, head, blobs in records:
            if kind == CONFIGURE:
                sync = SyncSettings(**head["sync"]) if head["sync"] else None
                shard.configure(optimizer=tuple(head["optimizer"]) if head["optimizer"] else None, sync=sync)
            elif kind == INIT_DENSE:
                specs = [Spec(n, d, tuple(shape)) for n, d, shape in head["specs"]]
                shard.init_dense(specs, bytearray(blobs))
            elif kind == TABLES:
                shard.declare_tables([TableSpec(**t) for t in head["tables"]])
            elif kind == PUSH:
                _replay_push(shard, head, blobs)
            elif kind == FLUSH:
                shard.flush(log=False)
            else:
                raise ValueError(f"{path}: unknown record kind {kind}")
            count += 1
    return count, last
