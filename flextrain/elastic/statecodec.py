"""A safe byte format for model/optimizer state: JSON skeleton + raw tensors.

Used to hand the model and optimizer state to a worker joining a round (a
broadcast over the collective) and for checkpoints. It replaces pickle-based
``torch.save``/``torch.load`` on purpose: bytes that came from another process
are never unpickled (DESIGN.md, "Wire rules"). The skeleton keeps what
``state_dict()`` trees contain: dicts with int or str keys, lists, tuples,
None/bool/int/float/str, and tensors of any dtype.

Layout: ``b"FTST"`` | uint32 format version | uint64 header length | header
JSON | tensor bytes back to back. The header holds the skeleton and, per
tensor, dtype, shape and byte length.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

MAGIC = b"FTST"
VERSION = 1
_PREFIX = struct.Struct("<4sIQ")

_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    )
}


class StateCodecError(ValueError):
    pass


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def encode(tree: Any) -> bytes:
    """Serialise a state tree to bytes."""
    metas: list[dict] = []
    blobs: list[bytes] = []

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            dtype = str(node.dtype).removeprefix("torch.")
            if dtype not in _DTYPES:
                raise StateCodecError(f"cannot encode tensor of dtype {node.dtype}")
            data = _tensor_bytes(node)
            metas.append({"dtype": dtype, "shape": list(node.shape), "nbytes": len(data)})
            blobs.append(data)
            return {"t": len(metas) - 1}
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, (str, int)) or isinstance(key, bool):
                    raise StateCodecError(f"cannot encode dict key {key!r}")
            return {"d": [[key, walk(value)] for key, value in node.items()]}
        if isinstance(node, tuple):
            return {"u": [walk(v) for v in node]}
        if isinstance(node, list):
            return {"l": [walk(v) for v in node]}
        if node is None or isinstance(node, (bool, int, float, str)):
            return {"v": node}
        raise StateCodecError(f"cannot encode value of type {type(node).__name__}")

    skeleton = walk(tree)
    header = json.dumps({"tree": skeleton, "tensors": metas}).encode()
    return b"".join([_PREFIX.pack(MAGIC, VERSION, len(header)), header, *blobs])


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Rebuild a state tree from :func:`encode` output (tensors on CPU)."""
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise StateCodecError("state blob too short")
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC or version != VERSION:
        raise StateCodecError(f"not a flextrain state blob (magic {magic!r}, version {version})")
    start = _PREFIX.size + header_len
    if start > len(view):
        raise StateCodecError("state blob header truncated")
    try:
        header = json.loads(bytes(view[_PREFIX.size : start]))
        tree, metas = header["tree"], header["tensors"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateCodecError(f"state blob header is corrupt: {exc}") from exc
    tensors = []
    offset = start
    for meta in metas:
        dtype = _DTYPES.get(meta.get("dtype"))
        if dtype is None:
            raise StateCodecError(f"unknown tensor dtype {meta.get('dtype')!r}")
        end = offset + meta["nbytes"]
        if end > len(view):
            raise StateCodecError("state blob tensor data truncated")
        try:
            if meta["nbytes"] == 0:
                tensors.append(torch.empty(meta["shape"], dtype=dtype))
            else:
                raw = torch.frombuffer(bytearray(view[offset:end]), dtype=torch.uint8)
                tensors.append(raw.view(dtype).reshape(meta["shape"]).clone())
        except RuntimeError as exc:
            raise StateCodecError(f"tensor {len(tensors)} does not match its shape/dtype: {exc}") from exc
        offset = end

    def build(node: dict) -> Any:
        ((kind, value),) = node.items()
        if kind == "t":
            return tensors[value]
        if kind == "d":
            return {key: build(v) for key, v in value}
        if kind == "u":
            return tuple(build(v) for v in value)
        if kind == "l":
            return [build(v) for v in value]
        return value

    try:
        return build(tree)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise StateCodecError(f"state blob skeleton is corrupt: {exc}") from exc


def nonfinite(tree: Any, *, limit: int = 5) -> list[str]:
    """Where a state tree holds NaN or infinite values: ``["model.net.0.weight (3 NaN, 1 inf of 640)"]``
    for up to ``limit`` float tensors (integer tensors cannot be non-finite)."""
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if len(found) >= limit:
            return
        if isinstance(node, torch.Tensor):
            if node.is_floating_point() or node.is_complex():
                nan, inf = int(torch.isnan(node).sum()), int(torch.isinf(node).sum())
                if nan or inf:
                    counts = ", ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "inf")) if n)
                    found.append(f"{path} ({counts} of {node.numel()})")
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(tree, "")
    return found
