"""Received gradients on a PS shard, from the wire until the optimizer runs (no gRPC, no locking policy).

Contracts:

* **parsing** (:func:`parse_dense`, :func:`parse_sparse`): a push's bytes are
  checked against the shard's dense layout and declared tables, and bad input
  raises ValueError naming the parameter, table or PS (PreconditionError when
  the dense parameters are not initialised yet). Called before the shard lock
  is taken; dense gradients stay in the received buffer (no copy), sparse
  blocks become one ``(unique ids, summed rows)`` pair per table.
* **buffer reuse** (:class:`BufferPool`): received dense buffers are handed
  back once consumed and reused for the next push of the same size (fresh big
  buffers cost page faults). A buffer the write-ahead log still has to write
  is *pinned*: handed back, it only returns to the pool once the log unpins
  it. Thread-safe on its own.
* **SYNC accumulation** (:class:`Accumulator`): the pushes collected towards
  the next update, summed in place into the first push's buffer, or (when
  that buffer is pinned: the log has not written it yet) into a buffer of the
  pool. Not thread-safe: the shard calls it under its lock.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch

from flextrain.protocol.codec import RowBlock, concat_blocks, merge_rows
from flextrain.ps.dense import DenseStore
from flextrain.ps.embedding import EmbeddingTable
from flextrain.ps.settings import PreconditionError
from flextrain.protocol.shard import as_row_ids

_SPARE_BUFFERS = 4  # received gradient buffers kept for reuse

SparseGrads = dict[str, tuple[np.ndarray, torch.Tensor]]  # table -> (unique ids, summed rows)


def parse_dense(store: DenseStore | None, layout_id: int, dense: bytearray | None, absent, *,
                shard_index: int) -> tuple[object, set[str]]:
    """(gradients wrapping ``dense`` with absent parameters zeroed, or None; the absent names).

    Without dense bytes every parameter of ``store`` is absent.
    """
    if dense is None:
        return None, {s.name for s in store.layout} if store else set()
    if store is None:
        raise PreconditionError(f"dense parameters are not initialised on PS {shard_index}; "
                                f"call init_dense first")
    if layout_id != store.layout_id or len(dense) != store.total_bytes:
        raise ValueError(f"dense gradients do not match the layout of PS {shard_index} (layout id "
                         f"{layout_id} vs {store.layout_id}, {len(dense)} vs {store.total_bytes} bytes); "
                         f"pull the parameters again")
    absent_set = set(absent)
    unknown = absent_set - {s.name for s in store.layout}
    if unknown:
        raise ValueError(f"unknown dense parameter(s) {sorted(unknown)} on PS {shard_index}")
    grads = store.wrap(dense)
    store.zero(grads, absent_set)
    return grads, absent_set


def parse_sparse(sparse: list[RowBlock], table: Callable[[str], EmbeddingTable]) -> SparseGrads:
    """Per table, (unique ids, summed gradient rows): validated, one copy of the received bytes.

    ``table(name)`` returns the shard's table or raises ValueError for an unknown one.
    """
    blocks: dict[str, list[RowBlock]] = {}
    tables: dict[str, EmbeddingTable] = {}
    for block in sparse:
        t = tables[block.table] = table(block.table)
        if block.dim != t.spec.dim:
            raise ValueError(f"embedding table {block.table!r}: gradient rows of width {block.dim}, "
                             f"the table's dim is {t.spec.dim}")
        blocks.setdefault(block.table, []).append(block)
    merged = {}
    for name, parts in blocks.items():
        ids, values = concat_blocks(parts, tables[name].dtype)
        merged[name] = merge_rows(as_row_ids(ids, name), values)
    return merged


class BufferPool:
    """Buffers for pushes' dense bytes, recycled once their gradients are consumed (and written)."""

    def __init__(self) -> None:
        self._spare: list[bytearray] = []
        self._pins: dict[int, int] = {}       # id(owner) -> pins (the write-ahead log's pending records)
        self._returned: set[int] = set()      # handed back while pinned: recycled at the last unpin
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bytearray:
        """A buffer of ``nbytes``, recycled from earlier pushes when one of that size is spare."""
        with self._lock:
            for i, buf in enumerate(self._spare):
                if len(buf) == nbytes:
                    return self._spare.pop(i)
        return bytearray(nbytes)

    def give_back(self, grads) -> None:
        """Keep the buffer under ``grads`` (None: nothing) for reuse; the caller no longer touches it."""
        if grads is not None and grads.owner is not None:
            with self._lock:
                key = id(grads.owner)
                if key in self._pins:
                    self._returned.add(key)
                elif len(self._spare) < _SPARE_BUFFERS:
                    self._spare.append(grads.owner)

    def pin(self, grads) -> None:
        """``grads`` must not be reused (nor changed) until :meth:`unpin`: the log still reads it."""
        if grads is not None and grads.owner is not None:
            with self._lock:
                key = id(grads.owner)
                self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, grads) -> None:
        if grads is not None and grads.owner is not None:
            with self._lock:
                key = id(grads.owner)
                left = self._pins.pop(key) - 1
                if left:
                    self._pins[key] = left
                elif key in self._returned:
                    self._returned.discard(key)
                    if len(self._spare) < _SPARE_BUFFERS:
                        self._spare.append(grads.owner)

    def pinned(self, grads) -> bool:
        with self._lock:
            return grads is not None and grads.owner is not None and id(grads.owner) in self._pins


class Accumulator:
    """SYNC mode: the accepted pushes collected towards the next update."""

    def __init__(self, pool: BufferPool | None = None) -> None:
        self.pool = pool or BufferPool()
        self.pending = 0                  # pushes collected
        self.dense = None                 # DenseArena summing the pending dense gradients
        self.absent: set[str] | None = None  # parameters absent from every pending push
        self._sparse: dict[str, list[tuple[np.ndarray, torch.Tensor]]] = {}

    def add(self, grads, absent: set[str], sparse: SparseGrads) -> list:
        """Collect one push; returns the gradients whose buffers are now free (summed into another)."""
        spent = []
        if grads is not None:
            if self.dense is None:
                self.dense = grads  # the received buffer is ours: sum into it, no copy
            elif self.pool.pinned(self.dense):  # the log still has to write it: sum into a fresh buffer
                first = self.dense
                owner = self.pool.take(len(first.buffer))
                self.dense = first.like(owner)
                for acc, a, b in zip(self.dense.groups, first.groups, grads.groups):
                    torch.add(a, b, out=acc)
                spent = [first, grads]
            else:
                for acc, g in zip(self.dense.groups, grads.groups):
                    acc.add_(g)
                spent = [grads]
        self.absent = absent if self.absent is None else self.absent & absent
        for name, block in sparse.items():
            self._sparse.setdefault(name, []).append(block)
        self.pending += 1
        return spent

    def sparse(self) -> SparseGrads:
        """Per table, the pending sparse gradients merged (duplicate ids summed)."""
        merged = {}
        for name, blocks in self._sparse.items():
            if len(blocks) == 1:  # already merged on arrival
                merged[name] = blocks[0]
            else:
                merged[name] = merge_rows(np.concatenate([b[0] for b in blocks]), torch.cat([b[1] for b in blocks]))
        return merged
