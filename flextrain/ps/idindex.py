"""A vectorised hash index from embedding id (int64 >= 0) to row number.

A Python dict costs a microsecond or more per id on the PS hot path (boxing
every id into a Python int, then a probe). This is an open-addressing
table with linear probing held in one numpy array of (key, row) pairs, so a
probe touches one cache line, probed for a whole batch of ids at once: each
round gathers one slot per still-unresolved id, so a lookup costs a few
vectorised passes (the expected probe length is < 2 at the maximum load
factor of 1/2); the first round, which resolves most ids, works on the
whole batch without index bookkeeping. Rows are never deleted, which keeps linear
probing simple: a key sits at the first free slot of its probe path as it was
at insertion, and slots only ever fill.
"""

from __future__ import annotations

import numpy as np

from flextrain.protocol.shard import mix64_array

_EMPTY = -1  # ids are >= 0, so -1 marks a free slot


class IdIndex:
    def __init__(self, capacity: int = 1024) -> None:
        cap = 16
        while cap < 2 * capacity:
            cap *= 2
        self._alloc(cap)
        self.size = 0

    def _alloc(self, cap: int) -> None:
        self._mask = np.uint64(cap - 1)
        self._kv = np.zeros((cap, 2), dtype=np.int64)  # [slot] = (key, row)
        self._kv[:, 0] = _EMPTY
        self._claim = np.zeros(cap, dtype=np.int64)  # scratch for resolving insertion races

    def _home(self, ids: np.ndarray) -> np.ndarray:
        return (mix64_array(ids.view(np.uint64)) & self._mask).astype(np.int64)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row numbers of ``ids`` (int64), -1 where an id is not in the index."""
        slot = self._home(ids)
        kv = np.take(self._kv, slot, axis=0)  # np.take: several times faster than 2-D fancy indexing
        hit = kv[:, 0] == ids
        out = np.where(hit, kv[:, 1], -1)
        pending = np.nonzero(~hit & (kv[:, 0] != _EMPTY))[0]  # collided on the way: probe on
        mask = np.int64(self._mask)
        slot = (slot[pending] + 1) & mask
        while len(pending):
            kv = np.take(self._kv, slot, axis=0)
            hit = kv[:, 0] == ids[pending]
            out[pending[hit]] = kv[:, 1][hit]
            more = (kv[:, 0] != _EMPTY) & ~hit
            pending, slot = pending[more], (slot[more] + 1) & mask
        return out

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ``ids`` (unique, none already present) mapping to ``rows``."""
        if (self.size + len(ids)) * 2 > len(self._kv):
            cap = len(self._kv)
            while (self.size + len(ids)) * 2 > cap:
                cap *= 2
            used = self._kv[:, 0] != _EMPTY
            old_keys, old_vals = self._kv[used, 0], self._kv[used, 1]
            self._alloc(cap)
            self._place(old_keys, old_vals)
        self._place(ids, rows)
        self.size += len(ids)

    def _place(self, ids: np.ndarray, rows: np.ndarray) -> None:
        slot = self._home(ids)
        pending = np.arange(len(ids))
        mask = np.int64(self._mask)
        while len(pending):
            free = np.take(self._kv[:, 0], slot) == _EMPTY
            cand, cslot = pending[free], slot[free]
            # Several ids may want the same free slot this round: exactly one of them
            # reads its own position back from the scratch array, whichever write won.
            order = np.arange(len(cand))
            self._claim[cslot] = order
            won = self._claim[cslot] == order
            self._kv[cslot[won], 0] = ids[cand[won]]
            self._kv[cslot[won], 1] = rows[cand[won]]
            placed = np.zeros(len(pending), dtype=bool)
            placed[np.nonzero(free)[0][won]] = True
            # Everyone else moves on: their slot is taken now (by another key or a race winner).
            pending, slot = pending[~placed], (slot[~placed] + 1) & mask
