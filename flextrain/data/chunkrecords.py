"""The records of one decoded RecordIO chunk, sliced out only when read."""

from __future__ import annotations

import struct

_LEN = struct.Struct("<I")


class ChunkRecords:
    """The records of one decoded chunk, cut out of its stream only when asked for.

    A task reads a few hundred records of a chunk that may hold many
    thousands; copying every record out at decode time would cost more than
    the decompression itself. Boundaries are known once: from a fixed
    ``stride`` (each record is a 4-byte length + ``stride - 4`` bytes) or
    from a list of record ``starts`` (lengths re-read from the stream).
    """

    __slots__ = ("_stream", "_n", "_stride", "_starts")

    def __init__(self, stream: bytes, n: int, *, stride: int = 0, starts: list[int] | None = None) -> None:
        self._stream, self._n, self._stride, self._starts = stream, n, stride, starts

    def __len__(self) -> int:
        return self._n

    def _one(self, i: int) -> bytes:
        if self._starts is None:
            begin = i * self._stride + 4
            return self._stream[begin : begin + self._stride - 4]
        begin = self._starts[i]
        (length,) = _LEN.unpack_from(self._stream, begin - 4)
        return self._stream[begin : begin + length]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._one(i) for i in range(*index.indices(self._n))]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(index)
        return self._one(index)

    def __iter__(self):
        return (self._one(i) for i in range(self._n))
