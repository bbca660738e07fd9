"""The dense parameters of one PS shard, kept in one byte arena.

Parameters are laid out in a canonical order — by dtype, then name — with
each dtype group starting at a 64-byte boundary. The flat bytes of that arena
are exactly what travels on the wire (``DenseLayout`` in ``proto/ps.proto``):

* a pull copies the arena into chunk-sized ``bytes`` once per version;
* a push arrives as a same-shaped byte buffer, and the optimizer runs on each
  dtype group as ONE flat tensor (a model with 500 small tensors costs a
  handful of vectorised ops, not 500 Python-level updates). Optimizer slots
  (momentum, Adam moments...) are arenas with the same layout.

Parameters without a gradient in an update are skipped entirely, like torch
skips ``grad is None``; then (or if step counts have diverged) the optimizer
runs per tensor on views of the same arenas.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from flextrain.protocol.codec import FLOAT_DTYPES
from flextrain.ps.optimizers import Optimizer
from flextrain.protocol.wire import PULL_DATA_TAG, gather_chunks

DTYPES = FLOAT_DTYPES
_ALIGN = 64


@dataclass(frozen=True)
class Spec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize


def check_specs(specs: list[Spec]) -> None:
    """ValueError for duplicate names, unsupported dtypes or negative dimensions."""
    seen: set[str] = set()
    for s in specs:
        if not s.name:
            raise ValueError("a dense parameter needs a name")
        if s.name in seen:
            raise ValueError(f"dense parameter {s.name!r} is listed twice")
        seen.add(s.name)
        if s.dtype not in DTYPES:
            raise ValueError(f"dense parameter {s.name!r}: dtype {s.dtype!r} is not one of {', '.join(DTYPES)}")
        if any(d < 0 for d in s.shape):
            raise ValueError(f"dense parameter {s.name!r}: negative dimension in shape {list(s.shape)}")


def canonical_layout(specs: list[Spec]) -> tuple[list[Spec], int, int]:
    """(specs with offsets in canonical order, total bytes, layout id)."""
    ordered = sorted(specs, key=lambda s: (s.dtype, s.name))
    out: list[Spec] = []
    offset, previous = 0, None
    for s in ordered:
        if s.dtype != previous:  # a new dtype group starts aligned, so typed views are aligned
            offset = -(-offset // _ALIGN) * _ALIGN
            previous = s.dtype
        out.append(Spec(s.name, s.dtype, tuple(s.shape), offset))
        offset += s.nbytes
    digest = hashlib.blake2b(digest_size=8)
    for s in out:
        digest.update(f"{s.name}\0{s.dtype}\0{','.join(map(str, s.shape))}\0{s.offset}\n".encode())
    return out, offset, int.from_bytes(digest.digest(), "little")


class DenseArena:
    """Typed views into one flat uint8 buffer laid out by ``layout``."""

    def __init__(self, layout: list[Spec], buffer: torch.Tensor, owner: bytearray | None = None) -> None:
        self.buffer = buffer
        self.owner = owner  # the bytearray behind ``buffer``, if any (recycled by the shard)
        self._layout = layout
        self._views: dict[str, torch.Tensor] | None = None
        self.groups: list[torch.Tensor] = []
        start = None
        for i, s in enumerate(layout):  # contiguous runs of one dtype -> one flat tensor each
            if start is None or s.dtype != layout[start].dtype:
                start = i
            if i + 1 == len(layout) or layout[i + 1].dtype != s.dtype:
                first, last = layout[start], s
                numel = (last.offset + last.nbytes - first.offset) // DTYPES[s.dtype].itemsize
                self.groups.append(self._view(first.offset, numel, s.dtype))

    def like(self, owner: bytearray) -> "DenseArena":
        """An arena of the same layout over ``owner`` (a buffer of the same size)."""
        return DenseArena(self._layout, torch.frombuffer(owner, dtype=torch.uint8) if len(owner) else
                          torch.zeros(0, dtype=torch.uint8), owner)

    @property
    def views(self) -> dict[str, torch.Tensor]:
        """Per-tensor views, built on first use (a push of a big model only needs ``groups``)."""
        if self._views is None:
            self._views = {s.name: self._view(s.offset, s.numel, s.dtype).view(s.shape) for s in self._layout}
        return self._views

    def _view(self, offset: int, numel: int, dtype: str) -> torch.Tensor:
        size = DTYPES[dtype].itemsize
        return self.buffer[offset: offset + numel * size].view(DTYPES[dtype])


class DenseStore:
    """Parameters, optimizer slots and per-parameter step counts of one shard."""

    def __init__(self, specs: list[Spec]) -> None:
        check_specs(specs)
        self.layout, self.total_bytes, self.layout_id = canonical_layout(specs)
        self.params = DenseArena(self.layout, torch.zeros(self.total_bytes, dtype=torch.uint8))
        self.slots: dict[str, DenseArena] = {}
        self.steps = {s.name: 0 for s in self.layout}

    @classmethod
    def from_stream(cls, specs: list[Spec], data: bytes | bytearray) -> "DenseStore":
        """A store holding tensors whose raw bytes come back to back in ``specs`` order (InitDense)."""
        check_specs(specs)
        expected = sum(s.nbytes for s in specs)
        if len(data) != expected:
            raise ValueError(f"InitDense sent {len(data)} bytes but its layout needs {expected}")
        store = cls(specs)
        if not isinstance(data, bytearray):
            data = bytearray(data)
        src = torch.frombuffer(data, dtype=torch.uint8) if expected else torch.zeros(0, dtype=torch.uint8)
        pos = 0
        for s in specs:
            if s.nbytes:
                store.params.views[s.name].view(-1).view(torch.uint8).copy_(src[pos: pos + s.nbytes])
            pos += s.nbytes
        return store

    def wrap(self, buffer: bytearray | torch.Tensor) -> DenseArena:
        """Typed views over a received gradient buffer of ``total_bytes``."""
        owner = None
        if not isinstance(buffer, torch.Tensor):
            owner = buffer
            buffer = torch.frombuffer(buffer, dtype=torch.uint8) if len(buffer) else torch.zeros(0, dtype=torch.uint8)
        return DenseArena(self.layout, buffer, owner)

    def zero(self, grads: DenseArena, names) -> None:
        """Zero the gradient bytes of ``names`` (absent gradients must add nothing when summed)."""
        for name in names:
            grads.views[name].zero_()

    def _ensure_slots(self, optimizer: Optimizer) -> None:
        for name, init in optimizer.slots().items():
            if name not in self.slots:
                arena = DenseArena(self.layout, torch.zeros(self.total_bytes, dtype=torch.uint8))
                for g in arena.groups:
                    g.fill_(init)
                self.slots[name] = arena

    def apply(self, optimizer: Optimizer, grads: DenseArena, absent: set[str], lr_scale: float = 1.0) -> None:
        """One optimizer step with ``grads``; parameters in ``absent`` are left untouched."""
        if not self.layout:
            return
        self._ensure_slots(optimizer)
        steps = set(self.steps.values())
        if not absent and len(steps) == 1:  # fast path: every group as one flat tensor
            step = steps.pop() + 1
            for i, group in enumerate(self.params.groups):
                state = {k: arena.groups[i] for k, arena in self.slots.items()}
                optimizer.update(group, grads.groups[i], state, step, lr_scale)
            self.steps = dict.fromkeys(self.steps, step)
            return
        for s in self.layout:
            if s.name in absent:
                continue
            step = self.steps[s.name] + 1
            state = {k: arena.views[s.name] for k, arena in self.slots.items()}
            optimizer.update(self.params.views[s.name], grads.views[s.name], state, step, lr_scale)
            self.steps[s.name] = step

    def encoded_chunks(self, chunk_bytes: int) -> list[bytes]:
        """The parameter arena as serialised ``PullDenseChunk{data}`` messages of ``chunk_bytes`` (one copy)."""
        view = memoryview(self.params.buffer.numpy())
        return list(gather_chunks([(0, view)], self.total_bytes, chunk_bytes, PULL_DATA_TAG))

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> dict:
        """Views of the arenas (the caller serialises them while holding the shard lock)."""
        return {
            "layout": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in self.layout],
            "params": self.params.buffer,
            "slots": {k: a.buffer for k, a in self.slots.items()},
            "steps": dict(self.steps),
        }

    @classmethod
    def from_state(cls, state: dict) -> "DenseStore":
        store = cls([Spec(d["name"], d["dtype"], tuple(d["shape"])) for d in state["layout"]])
        if state["params"].numel() != store.total_bytes:
            raise ValueError("checkpointed dense arena does not match its layout")
        store.params.buffer.copy_(state["params"])
        for name, buf in state["slots"].items():
            arena = DenseArena(store.layout, torch.zeros(store.total_bytes, dtype=torch.uint8))
            arena.buffer.copy_(buf)
            store.slots[name] = arena
        store.steps.update({k: int(v) for k, v in state["steps"].items()})
        return store
