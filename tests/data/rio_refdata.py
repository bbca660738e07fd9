"""Helpers for the data-layer tests: the reference RecordIO files and their
manifest (tests/testdata/recordio/MANIFEST.json). Uniquely named so it never
collides with helper modules of other test directories on sys.path."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

TESTDATA = Path(__file__).parents[1] / "testdata" / "recordio"
MANIFEST = json.loads((TESTDATA / "MANIFEST.json").read_text())
FILES = {entry["name"]: entry for entry in MANIFEST["files"]}

# The records of the synthetic reference files (records_python in the
# manifest, written out here rather than eval'ed).
NONE_SMALL_RECORDS = [(b"record-%d" % i) * (i + 1) for i in range(10)]
MULTI_RECORDS = [bytes((i * 31 + j * 7) % 256 for j in range(100)) for i in range(1000)]
EMPTY_RECORDS = [b"" if i % 3 == 0 else b"nonempty-%d" % i for i in range(20)]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def records_digest(records) -> str:
    """records_digest_sha256 as defined by the manifest."""
    h = hashlib.sha256()
    for rec in records:
        h.update(len(rec).to_bytes(4, "little"))
        h.update(rec)
    return h.hexdigest()


def chunk_bounds(entry) -> list[int]:
    """Cumulative record counts: record index where each chunk after the first starts."""
    bounds, total = [], 0
    for chunk in entry["chunks"][:-1]:
        total += chunk["num_records"]
        bounds.append(total)
    return bounds


def chunks_overlapping(entry, start: int, end: int) -> int:
    """How many chunks hold at least one record of [start, end)."""
    n, first = 0, 0
    for chunk in entry["chunks"]:
        last = first + chunk["num_records"]
        if start < last and first < end:
            n += 1
        first = last
    return n


def patch_bytes(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def read_header(path: Path, offset: int) -> tuple[int, int, int, int, int]:
    with open(path, "rb") as f:
        f.seek(offset)
        return struct.unpack("<5I", f.read(20))


def fix_crc(path: Path, chunk_offset: int) -> None:
    """Recompute a chunk's header CRC so damage inside the payload gets past
    the CRC check and must be caught by the decoder."""
    _, _, _, size, _ = read_header(path, chunk_offset)
    with open(path, "r+b") as f:
        f.seek(chunk_offset + 20)
        payload = f.read(size)
        f.seek(chunk_offset + 4)
        f.write(struct.pack("<I", zlib.crc32(payload)))


def snappy_frames(payload: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, length) of every frame of a snappy framing stream."""
    frames, pos = [], 0
    while pos < len(payload):
        length = int.from_bytes(payload[pos + 1 : pos + 4], "little")
        frames.append((pos, payload[pos], length))
        pos += 4 + length
    return frames
