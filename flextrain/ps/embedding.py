"""One embedding table of a PS shard: id -> row, created lazily, updated sparsely.

Storage is built for many rows: a vectorised hash index (idindex.py) maps
id -> row number, and rows, optimizer slots and per-row step counts live in
growable 2-D tensors (the capacity doubles, so appends are amortised O(1)).
Lookups, lazy creation, gathers and updates are vectorised over the batch of
ids: no Python-level work per id. Gathers and scatters go through numpy
views of the tensors (bit-exact integer views, so bfloat16 works too), which
are several times faster than torch's index_select/index_copy_ on one thread.

Every method takes the table's own lock, so PS threads may pull rows from one
table while another table (or the dense shard) is being updated.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from flextrain.protocol.codec import FLOAT_DTYPES, int_view, take_rows
from flextrain.protocol.limits import MAX_ROW_BYTES
from flextrain.ps.idindex import IdIndex
from flextrain.ps.initializers import check_initializer, initial_rows
from flextrain.ps.optimizers import Optimizer
from flextrain.protocol.shard import as_row_ids



@dataclass(frozen=True)
class TableSpec:
    """What a worker declares: the same spec must be declared on every PS."""

    name: str
    dim: int
    dtype: str = "float32"
    initializer: str = "normal"
    init_args: dict = field(default_factory=dict)
    seed: int = 0

    def validated(self) -> "TableSpec":
        """This spec with the initializer's arguments resolved; ValueError naming the table otherwise."""
        if not self.name:
            raise ValueError("an embedding table needs a name")
        if self.dim < 1:
            raise ValueError(f"embedding table {self.name!r}: dim must be >= 1, got {self.dim}")
        if self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"embedding table {self.name!r}: dtype {self.dtype!r} is not one of "
                             f"{', '.join(FLOAT_DTYPES)}")
        if self.dim * FLOAT_DTYPES[self.dtype].itemsize > MAX_ROW_BYTES:  # a row travels whole in one message
            raise ValueError(f"embedding table {self.name!r}: dim {self.dim} makes {self.dtype} rows wider than "
                             f"{MAX_ROW_BYTES} bytes")
        args = check_initializer(self.name, self.initializer, self.init_args)
        return TableSpec(self.name, int(self.dim), self.dtype, self.initializer, args, int(self.seed))

    def to_dict(self) -> dict:
        return {"name": self.name, "dim": self.dim, "dtype": self.dtype, "initializer": self.initializer,
                "init_args": dict(self.init_args), "seed": self.seed}


def _put(t: torch.Tensor, idx: np.ndarray, values: torch.Tensor) -> None:
    int_view(t)[idx] = int_view(values.contiguous())


class EmbeddingTable:
    """Rows of one table held by this PS (see the module docstring)."""

    def __init__(self, spec: TableSpec, capacity: int = 1024) -> None:
        self.spec = spec.validated()
        self.dtype = FLOAT_DTYPES[self.spec.dtype]
        self.lock = threading.Lock()
        self._index = IdIndex(capacity)
        self._n = 0
        cap = max(int(capacity), 1)
        self._ids = np.zeros(cap, dtype=np.int64)
        self._rows = torch.zeros((cap, self.spec.dim), dtype=self.dtype)
        self._steps = torch.zeros(cap, dtype=torch.int64)
        self._slots: dict[str, torch.Tensor] = {}
        self._slot_init: dict[str, float] = {}

    def __len__(self) -> int:
        return self._n

    def ids(self) -> np.ndarray:
        """The ids of the rows created so far (a copy, in creation order)."""
        with self.lock:
            return self._ids[: self._n].copy()

    # ------------------------------------------------------------------ storage

    def _grow(self, extra: int) -> None:
        need = self._n + extra
        cap = len(self._ids)
        if need <= cap:
            return
        while cap < need:
            cap *= 2

        def grown(t: torch.Tensor) -> torch.Tensor:
            out = torch.empty((cap, *t.shape[1:]), dtype=t.dtype)
            out[: self._n] = t[: self._n]
            return out

        ids = np.zeros(cap, dtype=np.int64)
        ids[: self._n] = self._ids[: self._n]
        self._ids, self._rows, self._steps = ids, grown(self._rows), grown(self._steps)
        self._slots = {name: grown(t) for name, t in self._slots.items()}

    def _indices(self, ids: np.ndarray) -> np.ndarray:
        """Row numbers of ``ids`` (validated int64), creating unseen rows with the initializer."""
        idx = self._index.lookup(ids)
        missing = idx < 0
        if missing.any():
            new_ids = np.unique(ids[missing])  # sorted, and an id asked twice is created once
            start, m = self._n, len(new_ids)
            self._grow(m)
            s = self.spec
            self._rows[start:start + m] = initial_rows(table=s.name, seed=s.seed, initializer=s.initializer,
                                                       args=s.init_args, ids=new_ids, dim=s.dim, dtype=self.dtype)
            for name, slot in self._slots.items():
                slot[start:start + m] = self._slot_init[name]
            self._steps[start:start + m] = 0
            self._ids[start:start + m] = new_ids
            self._index.insert(new_ids, np.arange(start, start + m, dtype=np.int64))
            self._n += m
            idx[missing] = start + np.searchsorted(new_ids, ids[missing])
        return idx

    def _ensure_slots(self, optimizer: Optimizer) -> None:
        for name, init in optimizer.slots().items():
            if name not in self._slots:
                self._slots[name] = torch.full((len(self._ids), self.spec.dim), init, dtype=self.dtype)
                self._slot_init[name] = init

    # ------------------------------------------------------------------ API

    def gather(self, ids) -> torch.Tensor:
        """Rows for ``ids`` in order, shape ``[len(ids), dim]`` (a copy); unseen ids are created.

        Negative ids or ids beyond int64 raise ValueError naming the table and the id.
        """
        ids = as_row_ids(ids, self.spec.name)
        with self.lock:
            idx = self._indices(ids)  # first: it may reallocate self._rows
            return take_rows(self._rows, idx)

    def gather_blocks(self, ids, per: int, *, snapshot: bool = True) -> Iterator[torch.Tensor]:
        """:meth:`gather` ``per`` rows at a time (at least one block, maybe empty).

        ``snapshot``: every block from one instant (gathered at once, under one lock).
        Otherwise each block is gathered under the lock only when asked for: the first
        block can leave before the last is copied, and a block is copied while the one
        before is still in cache, but an update may land between two blocks.
        """
        ids = as_row_ids(ids, self.spec.name)
        with self.lock:
            idx = self._indices(ids)  # rows are never moved to other indices, only appended
            rows = take_rows(self._rows, idx) if snapshot else None
        for a in range(0, max(len(idx), 1), per):
            if rows is not None:
                yield rows[a: a + per]
                continue
            with self.lock:  # _rows itself may have been reallocated by a pull creating rows
                block = take_rows(self._rows, idx[a: a + per])
            yield block

    def apply(self, optimizer: Optimizer, ids, grads: torch.Tensor, lr_scale: float = 1.0) -> None:
        """One optimizer step on the rows ``ids`` (unique) with gradient rows ``grads``.

        Only those rows, their optimizer slots and their step counts change.
        """
        ids = as_row_ids(ids, self.spec.name)
        if grads.shape != (len(ids), self.spec.dim):
            raise ValueError(f"embedding table {self.spec.name!r}: gradient shape {tuple(grads.shape)} does not "
                             f"match {len(ids)} ids x dim {self.spec.dim}")
        if len(ids) == 0:
            return
        with self.lock:
            self._ensure_slots(optimizer)
            idx = self._indices(ids)
            grads = grads.to(self.dtype)
            lr = optimizer.plain_lr()
            if lr is not None:  # plain SGD: one scatter-add, no gather
                self._rows.index_add_(0, torch.from_numpy(idx), grads, alpha=-lr * lr_scale)
                return
            param = take_rows(self._rows, idx)
            state = {name: take_rows(slot, idx) for name, slot in self._slots.items()}
            steps = take_rows(self._steps, idx) + 1 if optimizer.needs_step else None
            optimizer.update(param, grads, state, None if steps is None else steps.to(torch.float64).unsqueeze(1),
                             lr_scale)
            _put(self._rows, idx, param)
            for name, value in state.items():
                _put(self._slots[name], idx, value)
            if steps is not None:
                _put(self._steps, idx, steps)

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> dict:
        """Views of the used rows (the caller holds ``lock`` while it serialises them)."""
        n = self._n
        return {"spec": self.spec.to_dict(), "ids": torch.from_numpy(self._ids[:n]), "rows": self._rows[:n],
                "steps": self._steps[:n], "slots": {k: v[:n] for k, v in self._slots.items()},
                "slot_init": dict(self._slot_init)}

    @classmethod
    def from_state(cls, state: dict) -> "EmbeddingTable":
        table = cls(TableSpec(**state["spec"]), capacity=max(1024, len(state["ids"])))
        n = len(state["ids"])
        table._ids[:n] = state["ids"].numpy()
        table._rows[:n] = state["rows"]
        table._steps[:n] = state["steps"]
        for name, value in state["slots"].items():
            table._slots[name] = torch.empty((len(table._ids), table.spec.dim), dtype=table.dtype)
            table._slots[name][:n] = value
            table._slot_init[name] = float(state["slot_init"][name])
        table._index.insert(table._ids[:n].copy(), np.arange(n, dtype=np.int64))
        table._n = n
        return table
