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
``record_cache_mb``; 0 turns the cache off: each reader's own slot remains, as before the cache).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

__all__ = ["DEFAULT_RECORD_CACHE_MB", "RecordCacheStats", "configure_record_cache", "default_record_cache_mb",
           "record_cache", "ChunkCache"]

#: The budget without a setting, unless the container's memory limit is small (a quarter of it then):
#: the digits and overhead benches' data sets are 2-35 MiB, a typical RecordIO shard 32 MiB a chunk,
#: so 512 MiB keeps 16 full chunks, the working set of a worker's share of a mid-sized data set,
#: while leaving a 2 GiB pod three quarters of its memory for the model.
DEFAULT_RECORD_CACHE_MB = 512
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_MIB = 1 << 20


class RecordCacheStats(NamedTuple):
    """What a cache holds and did: ``bytes`` of decoded records in ``entries`` chunks, ``budget`` bytes."""

    budget: int
    bytes: int
    entries: int
    hits: int
    misses: int


def _cgroup_limit() -> int | None:
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # cgroup v1 writes a huge number for "no limit"
            return int(text)
    return None


def default_record_cache_mb(memory_limit: int | None = None) -> int:
    """:data:`DEFAULT_RECORD_CACHE_MB`, or a quarter of the worker's memory limit if that is less: the
    container's (cgroup) or ``memory_limit`` bytes (the job's ``--worker-memory-limit``), the smaller."""
    limits = [limit for limit in (_cgroup_limit(), memory_limit) if limit is not None]
    return min([DEFAULT_RECORD_CACHE_MB] + [limit // 4 // _MIB for limit in limits])


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


def configure_record_cache(mb: int | None, *, memory_limit: int | None = None) -> ChunkCache:
    """Set this process's cache budget: ``mb`` MiB, None for :func:`default_record_cache_mb` (of
    ``memory_limit`` bytes, the worker's limit if it has one), 0 for off. A smaller budget drops what
    no longer fits. Returns the cache."""
    global _cache
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 0):
        raise ValueError(f"record_cache_mb must be a whole number of MiB >= 0 (0 turns the cache off), got {mb!r}")
    budget = (default_record_cache_mb(memory_limit) if mb is None else mb) * _MIB
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
