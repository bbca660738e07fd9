"""Tensors on the PS wire: shared by the PS and PSClient (protocol, not PS internals).

DESIGN.md's wire rule — dtype name + shape + raw little-endian bytes, never
pickle — applied to the PS messages: ``flextrain.v1.Tensor`` for ids and
rows, ``DenseLayout`` for flat dense streams, ``SparseBlock`` for sparse
gradients. Every decoder checks dtype, rank and byte count before it builds
anything, and names the embedding table in its errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from flextrain.proto import flextrain_pb2 as fpb
from flextrain.proto import ps_pb2 as pb
from flextrain.protocol import wire
from flextrain.protocol.shard import as_row_ids, owner_bounds, row_owners

FLOAT_DTYPES = {name: getattr(torch, name) for name in ("float16", "bfloat16", "float32", "float64")}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def byte_view(t: torch.Tensor) -> memoryview:
    """A (writable) byte view sharing the memory of a contiguous CPU tensor."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def raw_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of ``t``, C order; no copy when it is already contiguous on the CPU."""
    return byte_view(t.detach().cpu().contiguous())


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def int_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of ``t`` as same-width integers: bit-exact gathers/scatters for any float dtype."""
    return t.view(_SAME_SIZE_INT[t.element_size()]).numpy()


def take_rows(t: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """``t[idx]`` along dim 0 (numpy's take: several times faster than torch indexing on one thread)."""
    return torch.from_numpy(np.take(int_view(t), idx, axis=0)).view(t.dtype)


def ids_to_proto(ids: np.ndarray) -> fpb.Tensor:
    return fpb.Tensor(dtype="int64", shape=[len(ids)], data=ids.astype("<i8", copy=False).tobytes())


def check_ids(dtype: str, shape, data, table: str) -> np.ndarray:
    """An int64 id vector (a read-only view of ``data``), or ValueError naming the table."""
    if dtype != "int64" or len(shape) != 1 or len(data) != 8 * shape[0]:
        raise ValueError(f"embedding table {table!r}: ids must be an int64 vector, got dtype {dtype!r} "
                         f"shape {list(shape)} with {len(data)} bytes")
    return np.frombuffer(data, dtype="<i8")


def check_rows(dtype: str, shape, data, table: str) -> torch.Tensor:
    """A ``[k, dim]`` float tensor owning a copy of ``data``, or ValueError naming the table."""
    tdtype = FLOAT_DTYPES.get(dtype)
    if tdtype is None or len(shape) != 2 or min(shape) < 0 or len(data) != shape[0] * shape[1] * tdtype.itemsize:
        raise ValueError(f"embedding table {table!r}: rows must be a 2-D float tensor, got dtype "
                         f"{dtype!r} shape {list(shape)} with {len(data)} bytes")
    if not len(data):
        return torch.zeros(tuple(shape), dtype=tdtype)
    return torch.frombuffer(bytearray(data), dtype=tdtype).view(tuple(shape))


def ids_from_proto(t: fpb.Tensor, table: str) -> np.ndarray:
    return check_ids(t.dtype, list(t.shape), t.data, table)


@dataclass
class RowBlock:
    """Gradient rows of one table as received: ids and raw row bytes, not yet copied."""

    table: str
    ids: np.ndarray          # int64 [k]; may be a read-only view of a received message
    dtype: torch.dtype
    dim: int
    data: memoryview         # k * dim * itemsize bytes, C order

    @classmethod
    def of(cls, table: str, ids, values: torch.Tensor) -> "RowBlock":
        """From in-process arrays (ids validated, values ``[len(ids), dim]``)."""
        ids = as_row_ids(ids, table)
        if values.ndim != 2 or values.shape[0] != len(ids):
            raise ValueError(f"embedding table {table!r}: {tuple(values.shape)} gradient rows for {len(ids)} ids")
        return cls(table, ids, values.dtype, values.shape[1], raw_bytes(values))


def decode_sparse_block(block) -> RowBlock:
    """The ``RowBlock`` of an encoded ``SparseBlock``, payloads left in place; ValueError if malformed."""
    table, ids, values = "", b"", b""
    for field, wt, value in wire.fields(block):
        if field == 1 and wt == 2:
            table = bytes(value).decode()
        elif field == 2 and wt == 2:
            ids = value
        elif field == 3 and wt == 2:
            values = value
    ids = check_ids(*wire.decode_tensor(ids), table)
    dtype, shape, data = wire.decode_tensor(values)
    tdtype = FLOAT_DTYPES.get(dtype)
    if tdtype is None or len(shape) != 2 or shape[0] != len(ids) or shape[1] < 1 \
            or len(data) != shape[0] * shape[1] * tdtype.itemsize:
        raise ValueError(f"embedding table {table!r}: gradient rows must be a float [{len(ids)}, dim] tensor, "
                         f"got dtype {dtype!r} shape {shape} with {len(data)} bytes")
    return RowBlock(table, ids, tdtype, shape[1], data)


def empty_rows(n: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised ``[n, dim]`` tensor whose memory numpy allocated: numpy asks for huge pages
    on big buffers, so filling a fresh one costs a fraction of the page faults torch's would (4-7x faster)."""
    return torch.from_numpy(np.empty((n, dim * dtype.itemsize), dtype=np.uint8)).view(dtype)


def strictly_increasing(ids: np.ndarray) -> bool:
    """True when ``ids`` are sorted without repeats: distinct for sure, no sort needed."""
    return len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1]))


def concat_blocks(blocks: list[RowBlock], dtype: torch.dtype) -> tuple[np.ndarray, torch.Tensor]:
    """All ids and rows of ``blocks`` (one table) as one array and one ``dtype`` tensor: one copy."""
    ids = np.concatenate([b.ids for b in blocks]) if len(blocks) > 1 else np.array(blocks[0].ids)
    values = empty_rows(len(ids), blocks[0].dim, dtype)
    into = int_view(values)
    pos = 0
    for b in blocks:
        if b.dim != blocks[0].dim:
            raise ValueError(f"embedding table {b.table!r}: gradient rows of different widths in one push")
        n = len(b.ids)
        if n and b.dtype == dtype:  # the common case: raw bytes straight into place
            into[pos: pos + n] = np.frombuffer(b.data, dtype=into.dtype).reshape(n, b.dim)
        elif n:
            raw = torch.from_numpy(np.frombuffer(b.data, dtype=np.uint8).copy())
            values[pos: pos + n] = raw.view(b.dtype).view(n, b.dim)  # converted to the table's dtype
        pos += n
    return ids, values


def encode_rows(rows: torch.Tensor) -> wire.Encoder:
    """``flextrain.v1.Tensor`` of a contiguous ``[k, dim]`` tensor, referencing its bytes."""
    return wire.encode_tensor(dtype_name(rows.dtype), list(rows.shape), raw_bytes(rows))


def distinct(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)``: ``first[k]`` is a position holding the k-th smallest distinct id,
    ``inverse[j]`` the k of position j. One sort (cheaper than ``np.unique``'s index outputs),
    none when the ids are sorted and distinct already (what ``torch.unique`` hands the PS embedding)."""
    if strictly_increasing(ids):
        every = np.arange(len(ids))
        return every, every
    order = np.argsort(ids)
    ordered = ids[order]
    new = np.empty(len(ids), dtype=bool)
    new[:1], new[1:] = True, ordered[1:] != ordered[:-1]
    inverse = np.empty(len(ids), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse


def merge_rows(ids: np.ndarray, values: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Sum the gradient rows of duplicate ids (an optimizer step needs one gradient per row).

    Without duplicates (the usual case) ``ids`` and ``values`` come back as they are.
    """
    if strictly_increasing(ids):
        return ids, values
    first, inverse = distinct(ids)
    if len(first) == len(ids):
        return ids, values
    out = empty_rows(len(first), values.shape[1], values.dtype).zero_()
    out.index_add_(0, torch.from_numpy(inverse), values)
    return ids[first], out


@dataclass(frozen=True)
class SparseBlocks:
    """One table's gradient rows bound for one PS, encoded a block at a time while iterated.

    Each iteration yields encoded ``PushChunk{sparse}`` messages of at most ``per`` rows. Encoding
    lazily, as gRPC sends, lets every block reuse the memory of the one sent before: building all
    of them up front costs fresh pages (page faults) for every byte of the push, several times
    the cost of the copy itself.
    """

    table: str
    ids: np.ndarray          # merged, validated
    values: torch.Tensor     # [len(ids), dim], contiguous
    sel: np.ndarray | slice  # positions in ids/values that go to this PS (a slice: a range of them)
    per: int                 # rows per block

    @property
    def count(self) -> int:
        return self.sel.stop - self.sel.start if isinstance(self.sel, slice) else len(self.sel)

    @property
    def messages(self) -> int:
        """How many ``PushChunk{sparse}`` messages iterating yields."""
        return -(-self.count // self.per)

    @property
    def nbytes(self) -> int:
        return self.count * (8 + self.values.shape[1] * self.values.element_size())

    def __iter__(self) -> Iterator[bytes]:
        name = self.table.encode()
        for a in range(0, self.count, self.per):
            if isinstance(self.sel, slice):  # views: the rows are copied once, into the message
                lo = self.sel.start + a
                hi = min(self.sel.stop, lo + self.per)
                part_ids, rows = np.ascontiguousarray(self.ids[lo: hi], dtype="<i8"), self.values[lo: hi]
            else:
                s = self.sel[a: a + self.per]
                part_ids, rows = np.ascontiguousarray(self.ids[s], dtype="<i8"), take_rows(self.values, s)
            block = (wire.Encoder().bytes_field(1, name)
                     .message_field(2, wire.encode_tensor("int64", [len(part_ids)], memoryview(part_ids).cast("B")))
                     .message_field(3, encode_rows(rows)))
            yield bytes(wire.Encoder().message_field(3, block))  # PushChunk.sparse = 3


def sparse_blocks(table: str, ids: np.ndarray, values: torch.Tensor, num_ps: int,
                  chunk_bytes: int) -> list[SparseBlocks]:
    """Per PS, one table's gradient (ids validated by the caller; duplicates are summed; each
    block holds at most ``chunk_bytes`` of values), encoded when iterated."""
    values = values.contiguous()
    per = max(1, chunk_bytes // max(1, values.shape[1] * values.element_size()))
    owners = row_owners(ids, num_ps)
    bounds = owner_bounds(ids, owners, num_ps)
    if bounds is not None:  # distinct and grouped by PS: each PS's rows are one range, sent without a gather
        return [SparseBlocks(table, ids, values, slice(int(lo), int(hi)), per) for lo, hi in zip(bounds, bounds[1:])]
    ids, values = merge_rows(ids, values)
    owners = row_owners(ids, num_ps)
    return [SparseBlocks(table, ids, values, np.nonzero(owners == i)[0] if num_ps > 1 else np.arange(len(ids)), per)
            for i in range(num_ps)]


def sparse_chunks(table: str, ids: np.ndarray, values: torch.Tensor, num_ps: int,
                  chunk_bytes: int) -> list[list[bytes]]:
    """:func:`sparse_blocks`, encoded at once: per PS, the ``PushChunk{sparse}`` messages."""
    return [list(blocks) for blocks in sparse_blocks(table, ids, values, num_ps, chunk_bytes)]


@dataclass(frozen=True)
class LayoutView:
    """A received ``DenseLayout``: ``specs`` are (name, dtype, shape, byte offset, byte count)."""

    specs: tuple
    total: int
    layout_id: int

    @classmethod
    def of(cls, m: pb.DenseLayout) -> "LayoutView":
        specs = []
        for t in m.tensors:
            dtype = FLOAT_DTYPES.get(t.dtype)
            if dtype is None or any(d < 0 for d in t.shape):
                raise ValueError(f"dense layout: bad tensor {t.name!r} ({t.dtype}, {list(t.shape)})")
            numel = int(np.prod(t.shape, dtype=np.int64)) if len(t.shape) else 1
            nbytes = numel * dtype.itemsize
            if t.offset < 0 or t.offset + nbytes > m.total_bytes:
                raise ValueError(f"dense layout: tensor {t.name!r} lies outside the {m.total_bytes}-byte stream")
            specs.append((t.name, dtype, tuple(t.shape), t.offset, nbytes))
        return cls(tuple(specs), m.total_bytes, m.layout_id)

    @property
    def names(self) -> set[str]:
        return {s[0] for s in self.specs}


def dense_targets(layout: LayoutView, out=None) -> tuple[dict[str, torch.Tensor], list[tuple[int, memoryview]]]:
    """Tensors to receive a flat dense stream into, and their byte views at stream offsets.

    ``out`` (name -> tensor) supplies destinations: each must be a contiguous CPU
    tensor of the layout's dtype and shape, and is written in place. The other
    tensors are views into one fresh buffer (no per-tensor copy either way).
    """
    tensors, segments, spare = {}, [], None
    for name, dtype, shape, offset, nbytes in layout.specs:
        t = out.get(name) if out is not None else None
        if t is not None and (t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous()
                              or t.device.type != "cpu"):
            raise ValueError(f"out[{name!r}] must be a contiguous CPU {dtype} tensor of shape {shape}")
        if t is None:
            spare = spare if spare is not None else bytearray(layout.total)
            t = (torch.frombuffer(spare, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).view(shape)
                 if nbytes else torch.zeros(shape, dtype=dtype))
        tensors[name] = t
        if nbytes:
            segments.append((offset, byte_view(t)))
    return tensors, segments


def dense_sources(layout: LayoutView, grads) -> tuple[list[tuple[int, memoryview]], list[str], int]:
    """(byte views of ``grads`` at their stream offsets, names without a gradient, stream size).

    No copy for contiguous CPU gradients of the parameter's dtype. When no
    parameter of the layout has a gradient the push has no dense part: ``([], [], 0)``.
    """
    segments, absent = [], []
    for name, dtype, shape, offset, nbytes in layout.specs:
        g = grads.get(name)
        if g is None:
            absent.append(name)
            continue
        if tuple(g.shape) != shape:
            raise ValueError(f"gradient of {name!r} has shape {tuple(g.shape)}, the parameter {shape}")
        if nbytes:
            segments.append((offset, byte_view(g.detach().to("cpu", dtype).contiguous())))
    if len(absent) == len(layout.specs):
        return [], [], 0
    return segments, absent, layout.total


def hyper_to_wire(hyper) -> dict[str, float]:
    """Optimizer hyperparameters as the wire's map<string, double> (torch's ``betas`` -> beta1, beta2)."""
    flat: dict[str, float] = {}
    for key, value in (hyper or {}).items():
        if key == "betas":
            flat["beta1"], flat["beta2"] = (float(v) for v in value)
        else:
            flat[key] = float(value)
    return flat


_TORCH_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad"}
_TORCH_KEYS = {"lr", "momentum", "dampening", "nesterov", "weight_decay", "betas", "eps", "amsgrad", "lr_decay",
               "initial_accumulator_value"}


def torch_optimizer_config(optimizer) -> tuple[str, dict[str, float]]:
    """(PS optimizer name, hyperparameters) equivalent to a ``torch.optim`` optimizer, e.g. the one a
    model-zoo ``optimizer(params, lr=...)`` returns; ValueError for what the PS cannot run."""
    name = _TORCH_OPTIMIZERS.get(type(optimizer).__name__)
    if name is None:
        raise ValueError(f"the parameter server cannot run {type(optimizer).__name__}; it runs "
                         f"{', '.join(f'torch.optim.{k}' for k in _TORCH_OPTIMIZERS)}")
    group = optimizer.param_groups[0]
    for other in optimizer.param_groups[1:]:
        differs = sorted(k for k in _TORCH_KEYS if other.get(k) != group.get(k))
        if differs:
            raise ValueError(f"the parameter server runs one optimizer setting; the param groups differ in {differs}")
    for flag in ("maximize", "differentiable"):
        if group.get(flag):
            raise ValueError(f"the parameter server does not support {flag}=True")
    if name == "adam" and group.get("decoupled_weight_decay"):
        name = "adamw"
    hyper = {k: v for k, v in group.items() if k in _TORCH_KEYS and v is not None}
    if name == "sgd" and not hyper.get("momentum"):
        hyper = {k: v for k, v in hyper.items() if k not in ("dampening", "nesterov")}
    if name.startswith("adam") and not hyper.get("amsgrad"):
        hyper.pop("amsgrad", None)
    return name, hyper_to_wire(hyper)
