"""A process-wide cache of decoded RecordIO chunks (like tf.data's ``Dataset.cache()``, per chunk).

A :class:`flextrain.data.recordio.RecordIOReader` keeps the one chunk it decoded last, which serves
the steps of a task (they read consecutive ranges of one chunk). Across tasks and epochs a worker
reads the same chunks again: without this cache each comes back from the file (read, CRC-checked,
decompressed and split into records) every time the reader's single slot held another chunk.

Entries are keyed by the file's identity when it was indexed (absolute path, size, ``mtime_ns``)
and the chunk's record range, so a rewritten file is a new key and is never served stale. What is
kept is the decoded records (:class:`flextrain.data.chunkrecords.ChunkRecords`), never anything
``feed`` made of them: ``feed`` still runs on every step's records (it may augment at random).

Bounded by a byte budget, least recently used out first; a chunk larger than the whole budget is
not kept. The budget is set once per process by :func:`configure_record_cache` (the job's
``record_cache_mb``; off by default and at 0: each reader's own slot remains, as before the cache).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

__all__ = ["DEFAULT_RECORD_CACHE_MB", "RecordCacheStats", "configure_record_cache", "record_cache", "ChunkCache"]

#: Off unless a job asks for it (``--record-cache-mb``), like tf.data's ``cache()``: on the benches'
#: data sets (a chunk or two per file, which each reader keeps anyway) a default-on cache made the
#: 1-worker job ~3-6% slower against an in-memory loop (bench/README.md, "Record cache default"), a
#: cost not yet explained; where files have many chunks it makes later epochs' reading ~30x faster.
DEFAULT_RECORD_CACHE_MB = 0
_MIB = 1 << 20


class RecordCacheStats(NamedTuple):
    """What a cache holds and did: ``bytes`` of decoded records in ``entries`` chunks, ``budget`` bytes."""

    budget: int
    bytes: int
    entries: int
    hits: int
    misses: int


class ChunkCache:
    """Decoded chunks by ``(path, size, mtime_ns, first record, end record)``, LRU within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"a record cache budget cannot be negative, got {budget} bytes")
        self.budget = budget
        self._entries: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
        self._bytes = self._hits = self._misses = 0
        self._lock = threading.Lock()

    def get(self, key: tuple):
        """The chunk cached under ``key`` (now the most recently used), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return found[0]

    def put(self, key: tuple, records, size: int) -> None:
        """Keep ``records`` (``size`` bytes) under ``key``, dropping the least recently used chunks
        to stay within the budget; nothing is kept when ``size`` alone exceeds it."""
        if size > self.budget:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (records, size)
            self._bytes += size
            while self._bytes > self.budget:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> RecordCacheStats:
        with self._lock:
            return RecordCacheStats(self.budget, self._bytes, len(self._entries), self._hits, self._misses)


_cache: ChunkCache | None = None
_configure_lock = threading.Lock()


def configure_record_cache(mb: int | None) -> ChunkCache:
    """Set this process's cache budget: ``mb`` MiB, None for :data:`DEFAULT_RECORD_CACHE_MB` (off),
    0 for off. A smaller budget drops what no longer fits. Returns the cache."""
    global _cache
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 0):
        raise ValueError(f"record_cache_mb must be a whole number of MiB >= 0 (0 turns the cache off), got {mb!r}")
    budget = (DEFAULT_RECORD_CACHE_MB if mb is None else mb) * _MIB
    with _configure_lock:
        if _cache is None:
            _cache = ChunkCache(budget)
        else:
            kept = list(_cache._entries.items()) if budget else []
            _cache.clear()
            _cache.budget = budget
            for key, (records, size) in kept:
                _cache.put(key, records, size)
        return _cache


def record_cache() -> ChunkCache:
    """This process's cache: the default budget until :func:`configure_record_cache` sets one."""
    cache = _cache
    return configure_record_cache(None) if cache is None else cache
