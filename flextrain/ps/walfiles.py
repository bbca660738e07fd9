"""The files of a PS write-ahead log: fixed-size segments, preallocated ahead and recycled, and their framing.

Contract:

* The log is a sequence of segment files ``<dir>/wal-<n>.log``, ``n``
  increasing. Each has room for ``segment_bytes``: the writer fills one, then
  moves on to ``n + 1`` (a record larger than a segment gets a segment of its
  own, which grows past the size). A file is never truncated: the valid log in
  it ends where its records stop validating.
* Why fixed-size and reused: on the development VM (ext4), writing 30 MB
  chunks one after the other took a median of 90-330 ms each into a new file
  (block allocation and writeback), 45-60 ms into ``posix_fallocate``'d space
  (with a long tail: the extents are converted as they are written) and 35 ms
  into blocks written once before (bench/README.md). So a helper thread
  prepares segment files ahead by writing them once (zeros with ``O_DIRECT``,
  then fdatasync: off the writer's path and out of the page cache), and a segment no kept checkpoint needs is
  *recycled*: renamed to the next future number and overwritten in place, as
  PostgreSQL recycles its WAL segments. Future segments are kept up to
  ``spares`` or as many as are in use, whichever is more (the rest are
  deleted), so the disk holds at most about twice the log since the oldest
  kept checkpoint, plus ``spares``. Segments are prepared once the log has
  filled a quarter of one (a PS that logs little costs no spare). If no
  prepared segment is ready the writer
  only ``posix_fallocate``s the next one (fast) and carries on.
* Framing: ``<u32 length><u32 crc32><u64 sum><u64 lsn><u32 segment>`` +
  payload; payload = kind byte, u32 JSON head length, JSON head, raw blobs
  (their lengths in the head). The CRC-32 covers lsn, segment, kind and head;
  the blobs (gradients: the bulk) are checked by a wrapping sum of their
  64-bit words, 4x cheaper than CRC-32 and enough to tell a record the process
  did not finish writing from a whole one. ``segment`` is the number of the
  file the record was written to: a recycled file still holds records of its
  previous life, and those name an older number, so they never validate under
  the new name. ``lsn`` (log sequence number) rises by one per record across
  segments; replay accepts only the next one expected (:func:`scan_segment`
  returns the valid prefix, the caller checks the chain).
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import mmap
import os
import re
import struct
import threading
import zlib
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
_NAME = re.compile(r"^wal-(\d+)\.log$")
FRAME = struct.Struct("<IIQQI")
_STAMP = struct.Struct("<QI")
HEAD = struct.Struct("<BI")
SEGMENT_BYTES = 128 << 20  # 3 of the bench's 32 MB dense pushes
SPARES = 4   # future segments kept at most (recycled ones first)
AHEAD = 2    # future segments the helper thread allocates when none are recycled
RELEASE_BYTES = 1 << 20  # SegmentFile.release() acts once this much more was written


def sum64(blob) -> int:
    """Wrapping sum of the little-endian 64-bit words of ``blob`` (a short tail counts as one word)."""
    view = memoryview(blob).cast("B")
    whole = len(view) // 8 * 8
    total = int(np.frombuffer(view[:whole], dtype="<u8").sum(dtype=np.uint64)) if whole else 0
    return (total + int.from_bytes(view[whole:], "little") + len(view)) & 0xFFFFFFFFFFFFFFFF


def frame(lsn: int, segment: int, prefix: bytes, blobs: list) -> bytes:
    """The frame header of a record (``prefix``: kind, head length, head; ``blobs``: the raw bytes)."""
    total = 0
    for blob in blobs:
        total = (total + sum64(blob)) & 0xFFFFFFFFFFFFFFFF
    size = len(prefix) + sum(len(b) for b in blobs)
    return FRAME.pack(size, zlib.crc32(prefix, zlib.crc32(_STAMP.pack(lsn, segment))), total, lsn, segment)


def path_of(directory: Path, number: int) -> Path:
    return directory / f"wal-{number}.log"


def segments(directory: Path) -> list[tuple[int, Path]]:
    """(number, path) of the log segments in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)))


def scan_segment(data: memoryview, number: int) -> tuple[list[tuple[int, int, dict, memoryview]], int]:
    """The valid records at the start of segment ``number``'s bytes, as (lsn, kind, head, blobs), and the
    byte length they span. Stops at the first record that is torn, damaged, from the file's previous life
    (another segment number), or not the successor of the one before it."""
    records, pos = [], 0
    while pos + FRAME.size <= len(data):
        size, crc, total, lsn, seg = FRAME.unpack_from(data, pos)
        body = data[pos + FRAME.size: pos + FRAME.size + size]
        if seg != number or len(body) != size or size < HEAD.size or (records and lsn != records[-1][0] + 1):
            break
        kind, head_len = HEAD.unpack_from(body)
        if HEAD.size + head_len > size or \
                zlib.crc32(body[: HEAD.size + head_len], zlib.crc32(_STAMP.pack(lsn, seg))) != crc:
            break
        try:
            head = json.loads(bytes(body[HEAD.size: HEAD.size + head_len]))
            lengths = [int(n) for n in head["blobs"]]
        except (ValueError, KeyError, TypeError):
            break
        blobs, at, check = body[HEAD.size + head_len:], 0, 0
        if sum(lengths) != len(blobs):
            break
        for n in lengths:
            check = (check + sum64(blobs[at: at + n])) & 0xFFFFFFFFFFFFFFFF
            at += n
        if check != total:
            break
        records.append((lsn, kind, head, blobs))
        pos += FRAME.size + size
    return records, pos


def read_records(path: Path) -> tuple[list[tuple[int, dict, memoryview]], int]:
    """The valid records of a segment file as (kind, head, blobs), and the byte length they span."""
    m = _NAME.match(path.name)
    if m is None:
        raise ValueError(f"{path} is not a write-ahead log segment (wal-<n>.log)")
    records, good = scan_segment(memoryview(path.read_bytes()), int(m.group(1)))
    return [(kind, head, blobs) for _, kind, head, blobs in records], good


class SegmentFile:
    """One open log segment, written from its start: ``writev`` (at the file's own offset, overwriting
    what a recycled file held), ``sync`` (fdatasync) and ``close``.

    The writer thread is its only user. Tests substitute their own file-like (same three methods)
    through ``WriteAheadLog(opener=...)``.
    """

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.offset = 0
        self._released = 0  # offset up to which release() last asked the kernel to drop pages

    def writev(self, views: list) -> int:
        written = os.pwritev(self.fd, views, self.offset)
        self.offset += written
        return written

    def sync(self) -> None:
        (getattr(os, "fdatasync", None) or os.fsync)(self.fd)

    def release(self) -> None:
        """Start writing back what was written so far and drop from the page cache the whole pages the
        device already holds (``POSIX_FADV_DONTNEED``: dirty pages are only queued for writeback, the
        partial last page stays). Called after each batch, so a page written one batch ago is usually
        dropped at the next; nothing reads the log back but replay, from a new process.

        Why: every byte logged otherwise grows the page cache by fresh memory, and on this VM the
        first touch of fresh memory costs ~10x a copy (bench/README.md, ps.py: "what the log costs");
        dropped pages go back to the free lists and the next batch reuses them while they are warm.
        Only once ``RELEASE_BYTES`` more were written (a syscall per small record is not worth it)."""
        if self.offset - self._released >= RELEASE_BYTES and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(self.fd, 0, self.offset, os.POSIX_FADV_DONTNEED)
            except OSError as exc:  # advice only: the log is written either way
                log.debug("write-ahead log: posix_fadvise failed: %s", exc)
            self._released = self.offset

    def close(self) -> None:
        os.close(self.fd)


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def name_thread(name: str) -> None:
    """Name the calling OS thread (``/proc/<pid>/task/<tid>/comm``, top -H), so a profile or
    ``bench/ps.py``'s per-thread CPU tells the log's threads from gRPC's. Best effort: Linux only."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15])  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def stop_thread(owner) -> None:
    """Mark ``owner`` closed under its ``_cond``, wake its ``_thread`` and join it (unless called from it)."""
    with owner._cond:
        owner._closed = True
        owner._cond.notify_all()
        thread = owner._thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()
    owner._thread = None


class SegmentPool:
    """Segment files ahead of the one being written: allocated or recycled by a helper thread.

    ``current`` is the number the writer writes to; at least ``min(AHEAD, spares)``
    future files (``current + 1``, ``current + 2``...) are kept ready, each
    ``segment_bytes`` long and written once, so moving to the next segment
    only opens a file. ``recycle`` turns old segments into future ones
    (rename) while fewer than ``max(spares, segments in use)`` wait, and
    deletes the rest. With ``fsync`` every new name is made durable (directory fsync)
    before the writer may use it.
    """

    def __init__(self, directory: Path, *, segment_bytes: int, spares: int, fsync: bool) -> None:
        if segment_bytes < 4096 or spares < 0:
            raise ValueError(f"write-ahead log segments must be >= 4096 bytes and spares >= 0 "
                             f"(got {segment_bytes}, {spares})")
        self.dir, self.segment_bytes, self.spares, self.fsync = directory, segment_bytes, spares, fsync
        self.current = -1
        self.recycled = 0         # segments renamed into future ones (tests and diagnostics)
        self.wanted = False       # the log has filled a quarter of a segment: prepare segments ahead
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self, number: int) -> None:
        """The writer starts on segment ``number``; begin keeping spares after it."""
        with self._cond:
            self.current = number
            if self._thread is None and self.spares:
                self._thread = threading.Thread(target=self._keeper, name="ps-wal-spares", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def note_used(self, used: int) -> None:
        """The writer has ``used`` bytes of its segment: a log this busy gets segments prepared ahead (a
        small one, e.g. a test's, never costs the disk a spare)."""
        if not self.wanted and 4 * used >= self.segment_bytes:
            with self._cond:
                self.wanted = True
                self._cond.notify_all()

    def advance(self) -> tuple[int, Path]:
        """Move the writer to the next segment; (number, path), the file allocated (at once if no spare was)."""
        with self._cond:
            self.current += 1
            self.wanted = True
            path = path_of(self.dir, self.current)
            if not path.exists():  # the helper fell behind (or spares=0): allocate on the writer's time
                self._allocate(path)
            self._cond.notify_all()
            return self.current, path

    def prepare(self, number: int) -> Path:
        """The path of segment ``number`` with its space allocated (the first segment of a log)."""
        with self._cond:
            path = path_of(self.dir, number)
            if not path.exists():
                self._allocate(path)
            return path

    def recycle(self, old: list[tuple[int, Path]]) -> None:
        """Segments no longer needed: renamed to future numbers while fewer than ``spares`` wait, else deleted."""
        with self._cond:
            gone = {n for n, _ in old}
            in_use = sum(1 for n, _ in segments(self.dir) if n <= self.current and n not in gone)
            for _, path in old:
                ahead = self._ahead()
                if len(ahead) < max(self.spares, in_use):
                    path.replace(path_of(self.dir, max([self.current, *ahead]) + 1))
                    self.recycled += 1
                else:
                    path.unlink(missing_ok=True)
            if old and self.fsync:
                sync_directory(self.dir)
            self._cond.notify_all()

    def close(self) -> None:
        stop_thread(self)

    # ---------------------------------------------------------------- under the lock

    def _ahead(self) -> list[int]:
        return [n for n, _ in segments(self.dir) if n > self.current]

    def _allocate(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, self.segment_bytes)
        finally:
            os.close(fd)
        if self.fsync:
            sync_directory(self.dir)

    def _keeper(self) -> None:
        name_thread("ps-wal-spares")
        tmp = self.dir / ".wal-spare.tmp"
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (
                    self.wanted and len(self._ahead()) < min(AHEAD, self.spares)))
                if self._closed:
                    return
            try:
                _write_once(tmp, self.segment_bytes)  # outside the lock: the writer may advance meanwhile
            except OSError as exc:  # the writer allocates for itself then (and reports a failure)
                log.warning("PS write-ahead log %s: cannot prepare a segment ahead: %s", self.dir, exc)
                with self._cond:
                    self._cond.wait(1.0)
                continue
            with self._cond:
                tmp.replace(path_of(self.dir, max([self.current, *self._ahead()]) + 1))
                if self.fsync:
                    sync_directory(self.dir)
                self._cond.notify_all()


_ZEROS = 4 << 20  # bytes per zero write when preparing a segment
_ALIGN = 4096     # O_DIRECT: buffer, offset and length multiples of the device's block size


def _write_once(path: Path, size: int) -> None:
    """Create ``path`` with ``size`` zero bytes written and flushed: its blocks allocated and initialised,
    so later writes are plain overwrites (no allocation, no unwritten-extent conversion).

    The zeros go with ``O_DIRECT`` from one page-aligned buffer straight to the device: through the
    page cache, allocating 128 MiB of new blocks cost this VM 25-275 ms of CPU per segment (every
    page allocated, zeroed and copied into), with ``O_DIRECT`` ~5 ms (bench/README.md, ps.py). A
    file system without ``O_DIRECT`` (tmpfs) or a size that is not a multiple of 4 KiB gets
    buffered writes instead."""
    direct = getattr(os, "O_DIRECT", 0) if size % _ALIGN == 0 else 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
    except OSError:  # EINVAL: no O_DIRECT here (tmpfs)
        if not direct:
            raise
        direct, fd = 0, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    zeros = mmap.mmap(-1, min(size, _ZEROS))  # anonymous: page-aligned and zero
    try:
        with memoryview(zeros) as view:
            for at in range(0, size, len(view)):
                try:
                    os.pwrite(fd, view[: size - at], at)
                except OSError as exc:  # EINVAL: the device wants a larger alignment; go on buffered
                    if not direct or exc.errno != errno.EINVAL:
                        raise
                    os.close(fd)
                    direct, fd = 0, os.open(path, os.O_WRONLY, 0o644)
                    os.pwrite(fd, view[: size - at], at)
        (getattr(os, "fdatasync", None) or os.fsync)(fd)
    finally:
        os.close(fd)
        zeros.close()
