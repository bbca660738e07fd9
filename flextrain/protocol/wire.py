"""Hot-path byte codec for the PS streams, shared by PS and PSClient.

The bulk of every push and pull is a few messages carrying big byte fields
(``PushChunk{dense|sparse}``, ``PullDenseChunk{data}``, ``PullEmbeddingChunk``
in ``proto/ps.proto``). Building and parsing those through protobuf objects
costs two to four extra copies of every byte per side, so this module writes
and reads exactly the same protobuf wire format by hand: the writer joins
references to the payloads once, the reader hands out memoryviews into the
received message. Small messages (headers, requests) use the generated
classes. Either way the bytes on the wire are plain protobuf, readable by any
protobuf implementation (tests compare both encoders byte for byte).

Like :mod:`flextrain.protocol.shard`, this is protocol, not PS internals: it
depends only on the standard library, and workers may import it.

The "flat stream" of a dense transfer is the tensors' raw bytes at their
layout offsets, with zero padding in between (dense.py aligns dtype groups).
:func:`gather_chunks` cuts such a stream from the source buffers without
first concatenating them; :class:`Scatter` writes a received stream straight
into destination buffers.
"""

from __future__ import annotations

from typing import Iterator, Sequence

PUSH_DENSE_TAG = 0x12   # PushChunk.dense: field 2, length-delimited
PULL_DATA_TAG = 0x2A    # PullDenseChunk.data: field 5, length-delimited
_ZEROS = bytes(1 << 16)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def gather_chunks(segments: Sequence[tuple[int, memoryview]], total: int, chunk: int,
                  tag: int) -> Iterator[bytes]:
    """Encoded single-field messages carrying the flat stream in pieces of ``chunk`` bytes.

    ``segments``: ``(offset, bytes view)`` sorted by offset, not overlapping;
    bytes not covered are sent as zeros. Each message costs one copy.
    """
    segs = sorted(segments, key=lambda s: s[0])
    i = 0
    for start in range(0, total, chunk):
        end = min(total, start + chunk)
        parts: list = [bytes((tag,)), varint(end - start)]
        pos = start
        while pos < end:
            while i < len(segs) and segs[i][0] + len(segs[i][1]) <= pos:
                i += 1
            if i < len(segs) and segs[i][0] <= pos:
                off, view = segs[i]
                take = min(end, off + len(view)) - pos
                parts.append(view[pos - off: pos - off + take])
            else:  # padding (or an absent tensor) up to the next segment
                nxt = segs[i][0] if i < len(segs) else end
                take = min(end, nxt) - pos
                while take > len(_ZEROS):
                    parts.append(_ZEROS)
                    take -= len(_ZEROS)
                    pos += len(_ZEROS)
                parts.append(_ZEROS[:take])
            pos += take
        yield b"".join(parts)


class Scatter:
    """Writes a flat stream, piece by piece in order, into destination buffers.

    ``segments``: ``(offset, writable byte view)``; bytes of the stream outside
    every segment (padding) are dropped. ``complete`` says whether exactly
    ``total`` bytes arrived.
    """

    def __init__(self, segments: Sequence[tuple[int, memoryview]], total: int) -> None:
        self.segs = sorted(segments, key=lambda s: s[0])
        self.total = total
        self.pos = 0
        self._i = 0

    def write(self, piece: memoryview | bytes) -> None:
        piece = memoryview(piece)  # slicing a view does not copy
        n = len(piece)
        if self.pos + n > self.total:
            raise ValueError(f"stream has more than the {self.total} bytes announced")
        start, end = self.pos, self.pos + n
        segs, i = self.segs, self._i
        while i < len(segs) and segs[i][0] < end:
            off, view = segs[i]
            lo, hi = max(start, off), min(end, off + len(view))
            if lo < hi:
                view[lo - off: hi - off] = piece[lo - start: hi - start]
            if off + len(view) > end:
                break  # this segment continues in the next piece
            i += 1
        self._i = i
        self.pos = end

    @property
    def complete(self) -> bool:
        return self.pos == self.total


# ---------------------------------------------------------------- a minimal protobuf writer/reader
#
# Enough of the wire format for the bulk messages that carry tensors
# (PushChunk{sparse}, PullEmbeddingChunk): the payload is referenced, not
# copied, until the one final join (writer) and handed out as a memoryview
# into the received message (reader).

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class Encoder:
    """Parts of one encoded message; ``bytes()`` joins them (the only copy of the payloads)."""

    def __init__(self) -> None:
        self.parts: list = []
        self.size = 0

    def _add(self, *parts) -> "Encoder":
        for p in parts:
            self.parts.append(p)
            self.size += len(p)
        return self

    def varint_field(self, field: int, value: int) -> "Encoder":
        return self._add(varint(field << 3 | _VARINT), varint(value & 0xFFFFFFFFFFFFFFFF)) if value else self

    def bytes_field(self, field: int, payload) -> "Encoder":
        return self._add(varint(field << 3 | _LEN), varint(len(payload)), payload)

    def message_field(self, field: int, msg: "Encoder") -> "Encoder":
        self._add(varint(field << 3 | _LEN), varint(msg.size))
        self.parts.extend(msg.parts)
        self.size += msg.size
        return self

    def packed_field(self, field: int, values) -> "Encoder":
        body = b"".join(varint(v & 0xFFFFFFFFFFFFFFFF) for v in values)
        return self.bytes_field(field, body) if values else self

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


def encode_tensor(dtype: str, shape: Sequence[int], data) -> Encoder:
    """``flextrain.v1.Tensor{dtype=1, shape=2 (packed), data=3}``."""
    enc = Encoder().bytes_field(1, dtype.encode()).packed_field(2, list(shape))
    return enc.bytes_field(3, data) if len(data) else enc


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n, pos
        shift += 7


def fields(message) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of each field: int for varints, memoryview for
    length-delimited and fixed-width fields. ValueError for malformed input or groups."""
    buf = memoryview(message)
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wt = key >> 3, key & 7
        if wt == _VARINT:
            value, pos = _read_varint(buf, pos)
        elif wt in (_I64, _I32):
            size = 8 if wt == _I64 else 4
            value, pos = buf[pos: pos + size], pos + size
        elif wt == _LEN:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos: pos + n], pos + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wt}")
        if pos > len(buf) or field == 0:
            raise ValueError("truncated protobuf message")
        yield field, wt, value


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def decode_tensor(message) -> tuple[str, list[int], memoryview]:
    """(dtype, shape, data view) of an encoded ``flextrain.v1.Tensor``."""
    dtype, shape, data = "", [], memoryview(b"")
    for field, wt, value in fields(message):
        if field == 1 and wt == _LEN:
            dtype = bytes(value).decode()
        elif field == 2 and wt == _LEN:
            pos = 0
            while pos < len(value):
                v, pos = _read_varint(value, pos)
                shape.append(_signed(v))
        elif field == 2 and wt == _VARINT:
            shape.append(_signed(value))
        elif field == 3 and wt == _LEN:
            data = value
    return dtype, shape, data
