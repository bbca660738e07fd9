"""A safe byte format for model/optimizer state: JSON skeleton + raw tensors.

Used to hand the model and optimizer state to a worker joining a round (a
broadcast over the collective) and for checkpoints. It replaces pickle-based
``torch.save``/``torch.load`` on purpose: bytes that came from another process
are never unpickled (DESIGN.md, "Wire rules"). The skeleton keeps what
``state_dict()`` trees contain: dicts with int or str keys, lists, tuples,
None/bool/int/float/str, and tensors of any dtype.

Layout: ``b"FTST"`` | uint32 format version | uint64 header length | header
JSON | tensor bytes back to back | uint32 CRC-32 (zlib) of everything before
it. The header holds the skeleton and, per tensor, dtype, shape and byte
length. The checksum makes a flipped byte or a cut-off file an error that
names it instead of a silently changed weight; it costs one pass over the
bytes (about 16 ms per 100 MiB on an idle core, 55 ms on a busy one), also
for the state broadcast to a joining worker. Version 1 blobs (no checksum)
still decode.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import torch

MAGIC = b"FTST"
VERSION = 2  # 2: CRC-32 trailer; 1: none
_PREFIX = struct.Struct("<4sIQ")
_CRC = struct.Struct("<I")

_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    )
}


# dtypes numpy holds as they are (bfloat16 has no numpy dtype: it is viewed as bytes first)
_NATIVE = frozenset(dtype for name, dtype in _DTYPES.items() if name != "bfloat16")


class StateCodecError(ValueError):
    pass


_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_FLOAT_WORDS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # json.dumps's words for them
_KEY_TEXT: dict[str, str] = {}  # str key -> its JSON (a state dict's keys repeat on every snapshot)
_SCALARS = frozenset((float, bool, type(None)))
_escape = json.encoder.encode_basestring_ascii  # what json.dumps uses (ensure_ascii)


class Encoded(NamedTuple):
    """:func:`encode_indexed`'s result: the blob and what its header says, as built (no parse needed)."""
    data: bytes
    start: int  # where the tensor bytes begin in ``data``
    metas: list  # per tensor, in order: (dtype name, nbytes, shape)
    spans: dict | None  # the top-level dict's str keys -> their tensors' index range (None: not a dict)


def _tensor_bytes(t: torch.Tensor):
    """The tensor's bytes without a copy where it is a contiguous CPU tensor (``encode`` joins them
    into its result, the one copy); others are copied to one first. A numpy array where numpy has the
    dtype (no reshape nor view: each a torch call, on every snapshot), else a memoryview."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu or not t.is_contiguous():
        t = t.cpu().contiguous()
    if t.dtype in _NATIVE:
        return t.numpy()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _scalar_text(node: Any) -> str:
    """``json.dumps(node)`` of a scalar of the skeleton (subclasses too: as json.dumps writes them)."""
    if node is None:
        return "null"
    if node is True or node is False:
        return "true" if node else "false"
    if isinstance(node, int):
        return int.__repr__(node)
    if isinstance(node, float):
        text = float.__repr__(node)
        return _FLOAT_WORDS.get(text, text)
    if isinstance(node, str):
        return _escape(node)
    raise StateCodecError(f"cannot encode value of type {type(node).__name__}")


def _key_text(key: Any) -> str:
    if type(key) is str:
        text = _KEY_TEXT.get(key)
        if text is None:
            if len(_KEY_TEXT) >= 4096:  # bounded: any tree's keys
                _KEY_TEXT.clear()
            text = _KEY_TEXT[key] = _escape(key)
        return text
    if not isinstance(key, (str, int)) or isinstance(key, bool):
        raise StateCodecError(f"cannot encode dict key {key!r}")
    return _scalar_text(key)


def encode(tree: Any) -> bytes:
    """Serialise a state tree to bytes."""
    return encode_indexed(tree).data


def encode_indexed(tree: Any) -> Encoded:
    """:func:`encode`, and what the writer of a snapshot checks without parsing the header again
    (:func:`nonfinite_encoded`). The header's JSON is written as the tree is walked (the bytes
    ``json.dumps`` gives for the skeleton: no skeleton of dicts is built and dumped)."""
    out: list[str] = []  # the skeleton's JSON, in pieces
    append = out.append
    metas: list[tuple[str, int, list]] = []
    meta_texts: list[str] = []
    blobs: list = []

    def tensor(node: torch.Tensor) -> None:
        dtype = _DTYPE_NAMES.get(node.dtype)
        if dtype is None:
            raise StateCodecError(f"cannot encode tensor of dtype {node.dtype}")
        data = _tensor_bytes(node)
        shape = list(node.shape)
        metas.append((dtype, data.nbytes, shape))
        meta_texts.append(f'{{"dtype": "{dtype}", "shape": {shape!r}, "nbytes": {data.nbytes}}}')
        blobs.append(data)
        append(f'{{"t": {len(metas) - 1}}}')

    def mapping(node: dict, spans: dict | None = None) -> None:
        if not node:
            append('{"d": []}')
            return
        sep = '{"d": [['
        for key, value in node.items():
            text = _KEY_TEXT.get(key) if type(key) is str else None
            append(sep + (text or _key_text(key)) + ", ")
            sep = "], ["
            if spans is None:
                walk(value)
            else:
                first = len(metas)
                walk(value)
                if type(key) is str:
                    spans[key] = (first, len(metas))
        append("]]}")

    def sequence(node, kind: str) -> None:
        if not node:
            append(f'{{"{kind}": []}}')
            return
        sep = f'{{"{kind}": ['
        for value in node:
            append(sep)
            sep = ", "
            walk(value)
        append("]}")

    def walk(node: Any) -> None:
        # dispatch on the exact type first: a state tree is ~all dicts, tensors and plain scalars
        cls = type(node)
        if cls is torch.Tensor:
            tensor(node)
        elif cls is dict or cls is OrderedDict:
            mapping(node)
        elif cls is str:
            append('{"v": ' + _escape(node) + "}")
        elif cls is int:
            append('{"v": ' + int.__repr__(node) + "}")
        elif cls in _SCALARS:
            append('{"v": ' + _scalar_text(node) + "}")
        elif cls is list:
            sequence(node, "l")
        elif cls is tuple:
            sequence(node, "u")
        elif isinstance(node, torch.Tensor):
            tensor(node)
        elif isinstance(node, dict):
            mapping(node)
        elif isinstance(node, tuple):
            sequence(node, "u")
        elif isinstance(node, list):
            sequence(node, "l")
        else:
            append('{"v": ' + _scalar_text(node) + "}")

    spans: dict | None = None
    if isinstance(tree, dict):
        spans = {}
        mapping(tree, spans)
    else:
        walk(tree)
    header = f'{{"tree": {"".join(out)}, "tensors": [{", ".join(meta_texts)}]}}'.encode()
    parts = [_PREFIX.pack(MAGIC, VERSION, len(header)), header, *blobs]
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    parts.append(_CRC.pack(crc))
    return Encoded(b"".join(parts), _PREFIX.size + len(header), metas, spans)


def _parse(view: memoryview, *, checksum: bool = True) -> tuple[int, Any, list, int]:
    """``(version, tree, tensor metas, start of the tensor bytes)``, the length and checksum verified
    (``checksum=False``: the length only)."""
    if len(view) < _PREFIX.size:
        raise StateCodecError("state blob too short")
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC or version not in (1, VERSION):
        raise StateCodecError(f"not a flextrain state blob (magic {magic!r}, version {version})")
    start = _PREFIX.size + header_len
    if start > len(view):
        raise StateCodecError("state blob header truncated")
    try:
        header = json.loads(bytes(view[_PREFIX.size : start]))
        tree, metas = header["tree"], header["tensors"]
        data_len = sum(int(meta["nbytes"]) for meta in metas)
    except (ValueError, KeyError, TypeError) as exc:
        raise StateCodecError(f"state blob header is corrupt: {exc}") from exc
    trailer = _CRC.size if version >= 2 else 0
    expected = start + data_len + trailer
    if len(view) < expected:
        raise StateCodecError(f"state blob tensor data truncated ({len(view)} of {expected} bytes)")
    if len(view) > expected:
        raise StateCodecError(f"state blob has {len(view) - expected} trailing bytes")
    if trailer and checksum:
        (stored,) = _CRC.unpack_from(view, expected - trailer)
        actual = zlib.crc32(view[: expected - trailer])
        if actual != stored:
            raise StateCodecError(f"state blob checksum mismatch (CRC-32 {actual:08x}, stored {stored:08x}): "
                                  "the bytes were changed after they were written")
    return version, tree, metas, start


def verify(data: bytes | bytearray | memoryview) -> None:
    """Check a blob's layout and checksum without building tensors; raises :class:`StateCodecError`."""
    _parse(memoryview(data))


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Rebuild a state tree from :func:`encode` output (tensors on CPU)."""
    view = memoryview(data)
    _, tree, metas, start = _parse(view)
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


def _nonfinite_line(path: str, nan: int, inf: int, size: int) -> str:
    counts = ", ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "inf")) if n)
    return f"{path} ({counts} of {size})"


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
                    found.append(_nonfinite_line(path, nan, inf, node.numel()))
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(tree, "")
    return found


_NUMPY = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "complex64": np.complex64,
          "complex128": np.complex128}


def nonfinite_blob(data: bytes | bytearray | memoryview, *, under: str = "model", limit: int = 5,
                   checksum: bool = True) -> list[str]:
    """:func:`nonfinite` of the tree's ``under`` entry, read in place from an :func:`encode` blob (no
    tensor is built: what a snapshot's writer checks before keeping it). Raises :class:`StateCodecError`
    for a blob that fails its checks (``checksum=False``: all but the CRC, for bytes this process's
    :func:`encode` just made)."""
    view = memoryview(data)
    _, tree, metas, start = _parse(view, checksum=checksum)
    offsets, offset = [], start
    for meta in metas:
        offsets.append(offset)
        offset += int(meta["nbytes"])
    found: list[str] = []

    def check(index: int, path: str) -> None:
        meta, lo = metas[index], offsets[index]
        raw = view[lo: lo + int(meta["nbytes"])]
        if meta["dtype"] == "bfloat16":  # numpy has none: NaN and inf are its all-ones exponents
            bits = np.frombuffer(raw, dtype=np.uint16)
            special = (bits & 0x7F80) == 0x7F80
            nan = int(np.count_nonzero(special & ((bits & 0x007F) != 0)))
            inf = int(np.count_nonzero(special)) - nan
        elif meta["dtype"] in _NUMPY:
            values = np.frombuffer(raw, dtype=_NUMPY[meta["dtype"]])
            if np.isfinite(values).all():
                return
            nan, inf = int(np.count_nonzero(np.isnan(values))), int(np.count_nonzero(np.isinf(values)))
        else:  # integers and bools cannot be non-finite
            return
        if nan or inf:
            found.append(_nonfinite_line(path, nan, inf, int(np.prod(meta["shape"]))))

    def walk(node: dict, path: str) -> None:
        ((kind, value),) = node.items()
        if len(found) >= limit:
            return
        if kind == "t":
            check(value, path)
        elif kind == "d":
            for key, child in value:
                walk(child, f"{path}.{key}" if path else str(key))
        elif kind in ("u", "l"):
            for i, child in enumerate(value):
                walk(child, f"{path}[{i}]")

    try:
        entries = dict((key, child) for key, child in tree["d"])
        if under in entries:
            walk(entries[under], "")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise StateCodecError(f"state blob skeleton is corrupt: {exc}") from exc
    return found



def nonfinite_encoded(encoded: Encoded, *, under: str = "model", limit: int = 5) -> list[str]:
    """:func:`nonfinite_blob` of :func:`encode_indexed`'s result: what a snapshot's writer checks
    before keeping it. Its tensors under ``under`` lie back to back: one numpy check per run of one
    dtype, the header not parsed; only where something is not finite is it parsed, to name it."""
    if encoded.spans is not None:
        span = encoded.spans.get(under)
        if span is None:
            return []
        if _finite(memoryview(encoded.data), encoded.start, encoded.metas, *span):
            return []
    return nonfinite_blob(encoded.data, under=under, limit=limit, checksum=False)


def _finite(view: memoryview, start: int, metas: list, lo: int, hi: int) -> bool:
    """Whether tensors ``lo`` to ``hi`` (exclusive) of an encoded blob are all finite."""
    offset = start + sum(meta[1] for meta in metas[:lo])
    run_dtype, run_lo = None, offset
    for dtype, nbytes, _ in [*metas[lo:hi], (None, 0, None)]:
        if dtype != run_dtype:
            raw = view[run_lo:offset]
            if run_dtype == "bfloat16":  # numpy has none: NaN and inf are its all-ones exponents
                if ((np.frombuffer(raw, dtype=np.uint16) & 0x7F80) == 0x7F80).any():
                    return False
            elif run_dtype in _NUMPY and not np.isfinite(np.frombuffer(raw, dtype=_NUMPY[run_dtype])).all():
                return False
            run_dtype, run_lo = dtype, offset
        offset += nbytes
    return True
