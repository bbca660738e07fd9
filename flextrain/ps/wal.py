"""Write-ahead log of a PS shard: what a relaunched PS replays on top of its checkpoint.

Contract:

* Every state change the shard acknowledges (configure, init_dense, new
  tables, accepted push, flush) is appended here *under the shard lock,
  before it is applied and answered* (``ShardState.wal``). So after a crash
  the newest checkpoint plus the log reproduces every acknowledged change,
  in the original order, through the same code paths (same updates, same
  versions, same minibatch bookkeeping); a change whose record did not make
  it to the log was never acknowledged, and its client retries it.
* Durability: a record is written with ``write(2)`` before the answer, so it
  survives the death of the PS *process* (SIGKILL, OOM, a crashed pod on the
  same volume). With ``fsync=True`` each record is also fsynced, which makes
  it survive the loss of the machine too, at the cost of one disk flush per
  push.
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
import zlib
from dataclasses import asdict
from pathlib import Path

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


class WriteAheadLog:
    """Appends records to the current segment; one writer at a time (the shard lock)."""

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = False) -> None:
        self.dir = Path(directory)
        self.fsync = fsync
        self.number = -1
        self._fd: int | None = None

    def open_segment(self, number: int) -> int:
        """Start writing segment ``number`` (closing the current one)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / f"wal-{number}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.close()
        self._fd, self.number = fd, number
        return number

    def rotate(self) -> int:
        """Start the next segment; returns its number (call under the shard lock)."""
        return self.open_segment(self.number + 1)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def prune(self, keep_from: int) -> None:
        """Delete segments numbered below ``keep_from`` (no kept checkpoint needs them)."""
        for n, path in segments(self.dir):
            if n < keep_from and n != self.number:
                path.unlink(missing_ok=True)

    # ---------------------------------------------------------------- records

    def _append(self, kind: int, head: dict, blobs: list) -> None:
        if self._fd is None:
            raise RuntimeError("write-ahead log is not open")
        blobs = [memoryview(b).cast("B") for b in blobs]
        head_bytes = json.dumps({**head, "blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
        prefix = _HEAD.pack(kind, len(head_bytes)) + head_bytes
        total = 0
        for blob in blobs:
            total = (total + _sum64(blob)) & 0xFFFFFFFFFFFFFFFF
        size = len(prefix) + sum(len(b) for b in blobs)
        self._write_all([_FRAME.pack(size, zlib.crc32(prefix), total), prefix, *blobs])
        if self.fsync:
            os.fsync(self._fd)

    def _write_all(self, parts: list) -> None:
        views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]  # writev of only empties: 0
        while views:
            written = os.writev(self._fd, views[:1024])
            if written == 0:  # would spin forever (full device, a closed pipe...): fail the update
                raise OSError(f"write-ahead log {self.dir}: write made no progress")
            while written and views:
                if written >= len(views[0]):
                    written -= len(views.pop(0))
                else:
                    views[0], written = views[0][written:], 0

    def log_configure(self, optimizer: tuple[str, dict] | None, sync) -> None:
        self._append(CONFIGURE, {"optimizer": list(optimizer) if optimizer else None,
                                 "sync": asdict(sync) if sync is not None else None}, [])

    def log_init_dense(self, specs: list[Spec], data) -> None:
        self._append(INIT_DENSE, {"specs": [[s.name, s.dtype, list(s.shape)] for s in specs]}, [data])

    def log_tables(self, specs: list[TableSpec]) -> None:
        self._append(TABLES, {"tables": [s.to_dict() for s in specs]}, [])

    def log_flush(self) -> None:
        self._append(FLUSH, {}, [])

    def log_push(self, client_id: str, seq: int, base: int, step, grads, absent: set[str], sparse: dict) -> None:
        blobs: list = []
        if grads is not None:
            blobs.append(_bytes_of(grads.buffer))
        tables = []
        for name, (ids, values) in sparse.items():
            ids = np.ascontiguousarray(ids, dtype="<i8")
            blobs += [memoryview(ids).cast("B"), _bytes_of(values)]
            tables.append([name, len(ids), int(values.shape[1]), str(values.dtype).removeprefix("torch.")])
        self._append(PUSH, {"client": client_id, "seq": seq, "base": base, "step": list(step) if step else None,
                            "dense": len(blobs[0]) if grads is not None else -1, "absent": sorted(absent),
                            "sparse": tables}, blobs)


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
