"""Data sources: the file-level API the rest of flextrain uses.

A *source* is one data file; a :class:`Shard` is a record range of a source.
The master calls :func:`make_shards` on the user's data path to plan tasks;
workers call :func:`read_shard_range` to fetch the records of a task.
Formats are chosen by file extension (see :data:`SUPPORTED_EXTENSIONS`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from flextrain.data.csv import CSVReader
from flextrain.data.errors import DataError
from flextrain.data.recordio import RecordIOReader

__all__ = [
    "SUPPORTED_EXTENSIONS",
    "Shard",
    "open_reader",
    "list_data_files",
    "make_shards",
    "read_shard_range",
    "clear_reader_cache",
]

Reader = RecordIOReader | CSVReader

#: Extension (lower case) -> reader factory.
_FACTORIES = {
    ".rio": RecordIOReader,
    ".recordio": RecordIOReader,
    ".csv": CSVReader,  # header=False: every line is a record
}
SUPPORTED_EXTENSIONS: tuple[str, ...] = tuple(sorted(_FACTORIES))
_EXTENSIONS_TEXT = ", ".join(SUPPORTED_EXTENSIONS)

# Workers read many tasks from the same few files: keep their indexes.
_CACHE_SIZE = 32
_cache: OrderedDict[tuple[str, int, int], Reader] = OrderedDict()
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class Shard:
    """Records ``[start, end)`` of the data file ``source``."""

    source: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"invalid shard range [{self.start}, {self.end}) for {self.source}")

    @property
    def size(self) -> int:
        return self.end - self.start


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _is_supported(path: str) -> bool:
    return _extension(path) in _FACTORIES


def open_reader(path: str | os.PathLike[str]) -> Reader:
    """Return a (cached) reader for one data file, chosen by extension.

    Raises DataError for a missing file or an unsupported extension, and
    CorruptRecordIOError (a DataError) for a structurally damaged RecordIO
    file. Readers are cached by absolute path, size and mtime, so a file that
    is rewritten is re-indexed instead of served from a stale index.
    """
    path = os.fspath(path)
    factory = _FACTORIES.get(_extension(path))
    if factory is None:
        raise DataError(f"unsupported data file {path}: supported extensions are {_EXTENSIONS_TEXT}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    with _cache_lock:
        reader = _cache.get(key)
        if reader is not None:
            _cache.move_to_end(key)
            return reader
    # Index outside the lock: it does I/O, and two threads racing on the same
    # file just both build an index (harmless).
    try:
        reader = factory(path)
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"expected a data file but found a directory: {path}") from None
    with _cache_lock:
        _cache[key] = reader
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return reader


def clear_reader_cache() -> None:
    """Drop all cached readers (for tests and long-lived processes)."""
    with _cache_lock:
        _cache.clear()


def list_data_files(path: str | os.PathLike[str], *, what: str = "data") -> list[str]:
    """Resolve a user-given data path to the sorted list of files to read.

    ``path`` may be one file (which must have a supported extension) or a
    directory, whose non-hidden regular files with supported extensions are
    returned sorted by name (no recursion; other files are ignored). ``what``
    names the data in error messages, e.g. ``"training data"``.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        kind = "file" if _is_supported(path) else "directory"
        raise DataError(f"{what} {kind} not found: {path}")
    if not os.path.isdir(path):
        if not _is_supported(path):
            raise DataError(
                f"{what} file {path} has an unsupported extension: supported extensions are {_EXTENSIONS_TEXT}"
            )
        return [path]
    files = [
        os.path.join(path, name)
        for name in sorted(os.listdir(path))
        if not name.startswith(".") and _is_supported(name) and os.path.isfile(os.path.join(path, name))
    ]
    if not files:
        raise DataError(f"{what} directory {path} contains no data files (looked for {_EXTENSIONS_TEXT} files)")
    return files


def make_shards(path: str | os.PathLike[str], *, what: str = "data") -> list[Shard]:
    """One shard per data file under ``path`` covering all of its records.

    Files without records are skipped; raises DataError if no file holds any
    record (a job over such data could never make progress).
    """
    files = list_data_files(path, what=what)
    shards = []
    for file in files:
        n = open_reader(file).num_records
        if n:
            shards.append(Shard(file, 0, n))
    if not shards:
        raise DataError(
            f"{what}: the file set under {os.fspath(path)} holds no records "
            f"({len(files)} file{'s' if len(files) != 1 else ''}, all empty)"
        )
    return shards


def read_shard_range(source: str | os.PathLike[str], start: int, end: int) -> list[bytes]:
    """Records ``[start, end)`` of data file ``source`` (via the reader cache)."""
    return open_reader(source).records(start, end)
