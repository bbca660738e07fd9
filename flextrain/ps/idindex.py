"""A vectorised hash index from embedding id (int64 >= 0) to row number.

A Python dict costs a microsecond or more per id on the PS hot path (boxing
every id into a Python int, then a probe). This is an open-addressing
table with linear probing held in two numpy arrays, probed for a whole batch
of ids at once: each round gathers one slot per still-unresolved id, so a
lookup costs a few vectorised passes (the expected probe length is < 2 at the
maximum load factor of 1/2). Rows are never deleted, which keeps linear
probing simple: a key sits at the first free slot of its probe path as it was
at insertion, and slots only ever fill.
"""

from __future__ import annotations

import numpy as np

from flextrain.ps.shard import mix64_array

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
        self._keys = np.full(cap, _EMPTY, dtype=np.int64)
        self._vals = np.zeros(cap, dtype=np.int64)
        self._claim = np.zeros(cap, dtype=np.int64)  # scratch for resolving insertion races

    def _home(self, ids: np.ndarray) -> np.ndarray:
        return (mix64_array(ids.view(np.uint64)) & self._mask).astype(np.int64)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row numbers of ``ids`` (int64), -1 where an id is not in the index."""
        out = np.full(len(ids), -1, dtype=np.int64)
        slot = self._home(ids)
        pending = np.arange(len(ids))
        mask = np.int64(self._mask)
        while len(pending):
            keys = self._keys[slot]
            hit = keys == ids[pending]
            out[pending[hit]] = self._vals[slot[hit]]
            more = (keys != _EMPTY) & ~hit
            pending, slot = pending[more], (slot[more] + 1) & mask
        return out

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ``ids`` (unique, none already present) mapping to ``rows``."""
        if (self.size + len(ids)) * 2 > len(self._keys):
            cap = len(self._keys)
            while (self.size + len(ids)) * 2 > cap:
                cap *= 2
            used = self._keys != _EMPTY
            old_keys, old_vals = self._keys[used], self._vals[used]
            self._alloc(cap)
            self._place(old_keys, old_vals)
        self._place(ids, rows)
        self.size += len(ids)

    def _place(self, ids: np.ndarray, rows: np.ndarray) -> None:
        slot = self._home(ids)
        pending = np.arange(len(ids))
        mask = np.int64(self._mask)
        while len(pending):
            free = self._keys[slot] == _EMPTY
            cand, cslot = pending[free], slot[free]
            # Several ids may want the same free slot this round: exactly one of them
            # reads its own position back from the scratch array, whichever write won.
            order = np.arange(len(cand))
            self._claim[cslot] = order
            won = self._claim[cslot] == order
            self._keys[cslot[won]] = ids[cand[won]]
            self._vals[cslot[won]] = rows[cand[won]]
            placed = np.zeros(len(pending), dtype=bool)
            placed[np.nonzero(free)[0][won]] = True
            # Everyone else moves on: their slot is taken now (by another key or a race winner).
            pending, slot = pending[~placed], (slot[~placed] + 1) & mask
