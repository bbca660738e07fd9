"""Replaying a PS write-ahead log on top of a checkpoint (the log itself: :mod:`flextrain.ps.wal`).

Contract: :func:`replay` applies, in order and through the shard's own code
paths, the records with LSNs after the checkpoint's ``wal_lsn``, following
the chain LSN by LSN across the segments in number order. The log ends at the
first record that is torn, damaged, left from a recycled file's previous
life, or not the next LSN: nothing after that point was acknowledged as part
of this log, so it is never replayed, and segments holding records past such
a break are reported (``Replayed.dropped``) so the caller can recycle them
before logging on (else a later replay would stop at the same break).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flextrain.ps.dense import Spec
from flextrain.ps.embedding import TableSpec
from flextrain.ps.settings import SyncSettings
from flextrain.ps.wal import CONFIGURE, FLUSH, INIT_DENSE, PUSH, TABLES
from flextrain.ps.walfiles import scan_segment, segments

log = logging.getLogger(__name__)


@dataclass
class Replayed:
    """What :func:`replay` found: records applied, the last LSN of the log, and its segments."""

    count: int = 0
    last_lsn: int = 0
    known: dict[int, int] = field(default_factory=dict)   # segment number -> LSN of its last valid record
    dropped: list[tuple[int, Path]] = field(default_factory=list)  # segments with records past a break
    highest: int = -1                                      # highest segment number in the directory


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


def replay(shard, directory: str | os.PathLike, *, after: int) -> Replayed:
    """Apply the log's records with LSNs ``> after`` to ``shard``, in order, up to the end of the valid log."""
    found = Replayed(last_lsn=after)
    broken = False
    for number, path in segments(Path(directory)):
        found.highest = number
        records, _ = scan_segment(memoryview(path.read_bytes()), number)
        if not records:
            continue
        if broken or records[0][0] > found.last_lsn + 1:
            if not broken:
                log.warning("PS write-ahead log %s: the log ends at LSN %d; %s starts at LSN %d: not replayed",
                            directory, found.last_lsn, path.name, records[0][0])
            broken = True
            found.dropped.append((number, path))
            continue
        found.known[number] = records[-1][0]
        for lsn, kind, head, blobs in records:
            if lsn <= found.last_lsn:
                continue  # in the checkpoint already
            _apply(shard, path, kind, head, blobs)
            found.last_lsn, found.count = lsn, found.count + 1
    return found


def _apply(shard, path: Path, kind: int, head: dict, blobs: memoryview) -> None:
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
