"""Pure-Python RecordIO, compatible with github.com/wangkuiyi/recordio (Go).

File format (see tests/testdata/recordio/MANIFEST.json, ``format``):

* A file is a sequence of chunks back to back from offset 0; no file header,
  footer or stored index. A file without records is 0 bytes long.
* Chunk header: 20 bytes, five little-endian uint32s
  ``[magic=0x01020304, crc32-IEEE(stored payload), compressor, payload_size,
  num_records]``, followed by ``payload_size`` payload bytes.
* Uncompressed payload: per record ``uint32-LE length`` + record bytes.
  Compressor 0 stores it as is, 1 as a Snappy *framing-format* stream,
  2 as one gzip member.
* Chunking: a chunk is cut before a record when the running sum of record
  lengths (prefixes excluded) plus the new record exceeds ``max_chunk_size``.

The reader indexes a file by walking chunk headers only and decodes just the
chunks a ranged read touches, like the Go ``LoadIndex`` + ``Scanner`` pair.
"""

from __future__ import annotations

import bisect
import enum
import gzip
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import cramjam
import numpy as np

from flextrain.data._ranges import check_range
from flextrain.data.batch import RecordBatch
from flextrain.data.chunkcache import record_cache
from flextrain.data.chunkrecords import ChunkRecords
from flextrain.data.errors import CorruptRecordIOError

__all__ = [
    "Compressor",
    "ChunkInfo",
    "RecordIOWriter",
    "RecordIOReader",
    "write_records",
    "read_records",
    "DEFAULT_MAX_CHUNK_SIZE",
]

MAGIC = 0x01020304
DEFAULT_MAX_CHUNK_SIZE = 32 * 1024 * 1024
_HEADER = struct.Struct("<5I")  # magic, checksum, compressor, size, num_records
_HEADER_SIZE = _HEADER.size  # 20
_LEN = struct.Struct("<I")
# Go's compress/gzip default level; together with mtime=0 this gives the same
# 10-byte member header as Go (1f 8b 08 00 00000000 00 ff).
_GZIP_LEVEL = 6
_GZIP_HEADER = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF])  # magic, deflate, no flags, mtime 0, XFL 0, OS 255


class Compressor(enum.IntEnum):
    """Compressor ids as stored in the chunk header."""

    NONE = 0
    SNAPPY = 1
    GZIP = 2


class ChunkInfo(NamedTuple):
    """One entry of a reader's chunk index (read from the header only)."""

    offset: int  # byte offset of the chunk header in the file
    checksum: int  # header CRC-32/IEEE of the stored payload
    compressor: Compressor
    compressed_size: int  # payload bytes following the header
    num_records: int


def _compress(stream: bytes, compressor: Compressor) -> bytes:
    if compressor is Compressor.NONE:
        return stream
    if compressor is Compressor.SNAPPY:
        # cramjam emits the framing format (stream identifier + <=64 KiB
        # frames with masked CRC-32C), like Go's snappy.NewBufferedWriter.
        return bytes(cramjam.snappy.compress(stream))
    return _gzip_member(stream)


def _gzip_member(data: bytes) -> bytes:
    """One gzip member with Go's header: mtime 0, XFL 0, OS 255 (unknown).

    gzip.compress(mtime=0) would write OS 3 (Unix); building the member by
    hand keeps the header identical to files written by the Go library.
    """
    deflate = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(data) + deflate.flush()
    trailer = struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)
    return _GZIP_HEADER + body + trailer


def _decompress(payload: memoryview, compressor: Compressor) -> bytes | memoryview:
    """Decode a verified payload (a view that is released afterwards: the result must not
    refer to it); raises ValueError-ish errors on bad data."""
    if compressor is Compressor.NONE:
        return payload.tobytes()
    if compressor is Compressor.SNAPPY:
        # cramjam checks every frame's masked CRC-32C and rejects streams
        # without the identifier frame (pinned by tests/data). Its output buffer is used
        # as is: copying it into ``bytes`` would cost as much as the decompression.
        return memoryview(cramjam.snappy.decompress(payload))
    return gzip.decompress(payload)


class RecordIOWriter:
    """Writes records into a RecordIO file, chunk by chunk.

    The file is created (truncated) on construction. Records are buffered
    until the Go chunking rule cuts a chunk; ``close()`` writes the last
    chunk. Use as a context manager so the last chunk is never lost.

    Unlike Go HEAD (which rejects ``len(record) >= max_chunk_size``) a record
    larger than ``max_chunk_size`` is accepted and gets a chunk of its own,
    as in pyrecordio 0.0.7; readers of both versions handle that.
    ``max_chunk_size <= 0`` selects the 32 MiB default, as in Go.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compressor: Compressor | int = Compressor.SNAPPY,
        max_chunk_size: int = DEFAULT_MAX_CHUNK_SIZE,
    ):
        self._compressor = Compressor(compressor)  # ValueError on unknown ids
        self._max_chunk_size = max_chunk_size if max_chunk_size > 0 else DEFAULT_MAX_CHUNK_SIZE
        self._path = os.fspath(path)
        self._records: list[bytes] = []
        self._record_bytes = 0
        self._num_chunks = 0
        self._file = open(self._path, "wb")

    @property
    def path(self) -> str:
        return self._path

    @property
    def num_chunks(self) -> int:
        """Chunks written to the file so far."""
        return self._num_chunks

    def write(self, record: bytes | bytearray | memoryview) -> None:
        """Append one record (any bytes-like object, may be empty)."""
        if self._file is None:
            raise ValueError(f"RecordIOWriter for {self._path} is closed")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"RecordIO records must be bytes-like, got {type(record).__name__}")
        record = bytes(record)  # own a copy: callers may reuse their buffers
        if self._records and self._record_bytes + len(record) > self._max_chunk_size:
            self._flush_chunk()
        self._records.append(record)
        self._record_bytes += len(record)

    def close(self) -> None:
        """Write the pending chunk (if any) and close the file. Idempotent."""
        if self._file is None:
            return
        try:
            if self._records:
                self._flush_chunk()
        finally:
            self._file.close()
            self._file = None

    def __enter__(self) -> RecordIOWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _flush_chunk(self) -> None:
        parts = []
        for rec in self._records:
            parts.append(_LEN.pack(len(rec)))
            parts.append(rec)
        payload = _compress(b"".join(parts), self._compressor)
        header = _HEADER.pack(MAGIC, zlib.crc32(payload), int(self._compressor), len(payload), len(self._records))
        self._file.write(header)
        self._file.write(payload)
        self._num_chunks += 1
        self._records = []
        self._record_bytes = 0


class RecordIOReader:
    """Random access to the records of one RecordIO file.

    Construction walks the chunk headers only (payloads are neither read nor
    checked), so opening a large file is cheap. Structural damage found while
    indexing (bad magic, truncated header, chunk extending past EOF, unknown
    compressor) raises :class:`CorruptRecordIOError` naming the chunk offset.
    Payload damage (CRC mismatch, undecodable compressed data, framing that
    does not add up to the header's record count) is detected when a chunk is
    decoded, i.e. by :meth:`read`, with the same exception.

    The reader holds no open file handle (each chunk load opens the file), so
    instances can be cached and shared across threads. The file must not
    change after the reader is created. Decoded chunks are kept in the
    process's record cache (:mod:`flextrain.data.chunkcache`) under the file's
    identity at indexing time (path, size, ``mtime_ns``): another reader of the
    same unchanged file finds them there, one of a rewritten file does not.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self._path = os.fspath(path)
        self._identity: tuple[str, int, int] = (os.path.abspath(self._path), -1, -1)  # set by _build_index
        self._chunks = self._build_index()
        self._cum: list[int] = []  # cum[c] = records in chunks 0..c
        total = 0
        for chunk in self._chunks:
            total += chunk.num_records
            self._cum.append(total)
        self._num_records = total
        # One decoded chunk, swapped as a single tuple so concurrent readers
        # never see an index paired with another chunk's records.
        self._cache: tuple[int, list[bytes]] | None = None
        self._chunks_decoded = 0
        self._stats_lock = threading.Lock()

    @property
    def path(self) -> str:
        return self._path

    @property
    def num_records(self) -> int:
        return self._num_records

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    @property
    def chunks(self) -> tuple[ChunkInfo, ...]:
        """The chunk index built from the headers, in file order."""
        return self._chunks

    @property
    def chunks_decoded(self) -> int:
        """How many chunk payloads this reader has read and decoded so far
        (cache hits excluded). Lets tests and benchmarks check that ranged
        reads touch only the chunks they need."""
        return self._chunks_decoded

    def read(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Yield records ``[start, end)`` (``end=None``: to the last record).

        Only chunks overlapping the range are decoded. Raises ValueError at
        call time (not on first ``next``) if the range is out of bounds.
        """
        start, end = check_range(self._path, start, end, self._num_records)
        return self._iter_range(start, end)

    def records(self, start: int, end: int) -> list[bytes]:
        """Records ``[start, end)`` as a list: what a worker asks for once per step."""
        start, end = check_range(self._path, start, end, self._num_records)
        out: list[bytes] = []
        for records, lo, hi in self._pieces(start, end):
            out += records[lo:hi]
        return out

    def batch(self, start: int, end: int) -> RecordBatch:
        """Records ``[start, end)`` as a :class:`RecordBatch`: no ``bytes`` object is made until
        one is asked for, and :meth:`RecordBatch.array` views the decoded chunk."""
        start, end = check_range(self._path, start, end, self._num_records)
        return RecordBatch(list(self._pieces(start, end)))

    def __iter__(self) -> Iterator[bytes]:
        return self.read(0, self._num_records)

    def verify(self) -> Iterator[tuple[ChunkInfo, CorruptRecordIOError | None]]:
        """Check every chunk as a read would (CRC-32, decompression, record framing), in file order:
        ``(chunk, its error or None)``. One chunk is decoded at a time and then dropped, past the record
        cache, so a file of any size is checked in the memory of one chunk."""
        for c, chunk in enumerate(self._chunks):
            try:
                self._decode_chunk(c)
            except CorruptRecordIOError as exc:
                yield chunk, exc
            else:
                yield chunk, None

    def __len__(self) -> int:
        return self._num_records

    def __repr__(self) -> str:
        return f"RecordIOReader({self._path!r}, num_records={self._num_records}, num_chunks={self.num_chunks})"

    # -- internals -----------------------------------------------------------

    def _iter_range(self, start: int, end: int) -> Iterator[bytes]:
        for records, lo, hi in self._pieces(start, end):
            yield from records[lo:hi]

    def _pieces(self, start: int, end: int) -> Iterator[tuple[ChunkRecords, int, int]]:
        """``(records of a chunk, lo, hi)`` for each chunk overlapping ``[start, end)``, in order,
        ``[lo, hi)`` being the range's part within the chunk; each chunk decoded when reached."""
        pos = start
        while pos < end:
            c = bisect.bisect_right(self._cum, pos)  # first chunk with pos < cum[c]
            first = self._cum[c - 1] if c else 0
            stop = min(end, self._cum[c])
            yield self._chunk_records(c), pos - first, stop - first
            pos = stop

    def _chunk_records(self, c: int) -> ChunkRecords:
        cached = self._cache
        if cached is not None and cached[0] == c:  # the chunk the last read touched: a task's next step
            return cached[1]
        key = (*self._identity, self._cum[c - 1] if c else 0, self._cum[c])
        shared = record_cache()
        records = shared.get(key)
        if records is None:
            records = self._decode_chunk(c)
            shared.put(key, records, records.nbytes)
        self._cache = (c, records)
        return records

    def _decode_chunk(self, c: int) -> ChunkRecords:
        chunk = self._chunks[c]
        with self._stats_lock:
            self._chunks_decoded += 1
        begin, end = chunk.offset + _HEADER_SIZE, chunk.offset + _HEADER_SIZE + chunk.compressed_size
        # The payload is checked and decompressed straight from the page cache (mmap): a chunk
        # is up to 32 MiB, and reading it into a fresh buffer first costs as much as the CRC.
        with open(self._path, "rb") as f:
            if os.fstat(f.fileno()).st_size < end:
                raise self._corrupt(chunk, "file is shorter than when it was indexed")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with mapped, memoryview(mapped) as view, view[begin:end] as payload:
            crc = zlib.crc32(payload)
            if crc != chunk.checksum:
                raise self._corrupt(
                    chunk, f"payload CRC-32 mismatch (header {chunk.checksum:#010x}, computed {crc:#010x})"
                )
            try:
                stream = _decompress(payload, chunk.compressor)
            except (cramjam.DecompressionError, OSError, EOFError, zlib.error) as exc:
                raise self._corrupt(chunk, f"cannot decode {chunk.compressor.name} payload: {exc}") from None
        return self._split_records(chunk, stream)

    def _split_records(self, chunk: ChunkInfo, stream: bytes) -> ChunkRecords:
        n, size = chunk.num_records, len(stream)
        stride = size // n if n else 0
        if n and stride >= 4 and stride * n == size:
            # Fast path for fixed-size records (the common case: one vectorised
            # check of every length field instead of a Python loop per record).
            lengths = np.frombuffer(stream, dtype=np.uint8).reshape(n, stride)[:, :4]
            if (np.ascontiguousarray(lengths).view("<u4").ravel() == stride - 4).all():
                return ChunkRecords(stream, n, stride=stride)
        starts: list[int] = []
        pos = 0
        for i in range(n):
            if pos + 4 > size:
                raise self._corrupt(chunk, f"payload holds {i} records, header says {n}")
            (length,) = _LEN.unpack_from(stream, pos)
            pos += 4
            if pos + length > size:
                raise self._corrupt(
                    chunk, f"record {i} of the chunk declares {length} bytes but only {size - pos} remain"
                )
            starts.append(pos)
            pos += length
        if pos != size:
            raise self._corrupt(chunk, f"{size - pos} trailing bytes after the {n} records the header declares")
        return ChunkRecords(stream, n, starts=starts)

    def _corrupt(self, chunk: ChunkInfo, reason: str) -> CorruptRecordIOError:
        return CorruptRecordIOError(self._path, chunk.offset, reason)

    def _build_index(self) -> tuple[ChunkInfo, ...]:
        chunks: list[ChunkInfo] = []
        with open(self._path, "rb") as f:
            st = os.fstat(f.fileno())
            file_size = st.st_size
            self._identity = (self._identity[0], st.st_size, st.st_mtime_ns)
            offset = 0
            while offset < file_size:
                f.seek(offset)
                raw = f.read(_HEADER_SIZE)
                if len(raw) < _HEADER_SIZE:
                    raise CorruptRecordIOError(
                        self._path, offset, f"truncated chunk header ({len(raw)} of {_HEADER_SIZE} bytes before EOF)"
                    )
                magic, checksum, comp_id, size, num_records = _HEADER.unpack(raw)
                if magic != MAGIC:
                    raise CorruptRecordIOError(self._path, offset, f"bad magic {magic:#010x} (expected {MAGIC:#010x})")
                try:
                    compressor = Compressor(comp_id)
                except ValueError:
                    raise CorruptRecordIOError(self._path, offset, f"unknown compressor id {comp_id}") from None
                end = offset + _HEADER_SIZE + size
                if end > file_size:
                    raise CorruptRecordIOError(
                        self._path,
                        offset,
                        f"chunk payload of {size} bytes extends past end of file "
                        f"({end - file_size} bytes missing; file is {file_size} bytes)",
                    )
                chunks.append(ChunkInfo(offset, checksum, compressor, size, num_records))
                offset = end
        return tuple(chunks)


def write_records(
    path: str | os.PathLike[str],
    records: Iterable[bytes],
    *,
    compressor: Compressor | int = Compressor.SNAPPY,
    max_chunk_size: int = DEFAULT_MAX_CHUNK_SIZE,
) -> int:
    """Write ``records`` to a new RecordIO file; returns the record count."""
    n = 0
    with RecordIOWriter(path, compressor=compressor, max_chunk_size=max_chunk_size) as writer:
        for record in records:
            writer.write(record)
            n += 1
    return n


def read_records(path: str | os.PathLike[str]) -> list[bytes]:
    """Read every record of a RecordIO file into a list."""
    return list(RecordIOReader(path))
