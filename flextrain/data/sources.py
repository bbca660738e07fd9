"""Data sources: the file-level API the rest of flextrain uses.

A *source* is one data file; a :class:`Shard` is a record range of a source.
The master calls :func:`make_shards` on the user's data path to plan tasks;
workers call :func:`read_shard_range` to fetch the records of a task.

A data path is a file, a directory (its files, sorted by name), a glob
(``data/part-*``; a matched directory gives its files, as in a list) or a
comma-separated list of those. Every file is
classified by content (:mod:`flextrain.data.formats`), so ElasticDL's
``data-00000`` shards need no extension. In a directory (or among a glob's
matches: its files) only dot-files, subdirectories and ``schema.json`` (the schema
``flextrain data convert`` writes beside its shards) are passed over; any other file
that is not RecordIO, CSV or Parquet is an error naming it, or with
``DataOptions(skip_unknown_files=True)`` a warning naming every file skipped.
One data path holds one format: RecordIO, CSV and Parquet files mixed are
refused. A Parquet file gives one shard per row group (large row groups cut
into pieces of at most ``PARQUET_SHARD_ROWS`` rows) and its records are row
dicts (:mod:`flextrain.data.parquet`).
"""

from __future__ import annotations

import glob
import logging
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flextrain.data.batch import RecordBatch
from flextrain.data.chunkcache import record_cache
from flextrain.data.csv import CSVReader
from flextrain.data.errors import DataError
from flextrain.data.formats import (CSV, EMPTY, FORMATS, HINT_EXTENSIONS, PARQUET, RECORDIO, NotDataError,
                                   odd_csv_files, sniff)
from flextrain.data.parquet import ParquetReader, shard_ranges
from flextrain.data.recordio import RecordIOReader
from flextrain.data.rows import SCHEMA_FILE
from flextrain.data.sql import is_sql_url

__all__ = [
    "SUPPORTED_EXTENSIONS",
    "PARQUET_SHARD_ROWS",
    "DataOptions",
    "Shard",
    "open_reader",
    "list_data_files",
    "make_shards",
    "read_shard_range",
    "clear_reader_cache",
]

log = logging.getLogger(__name__)

Reader = RecordIOReader | CSVReader | ParquetReader

#: Extensions that name a format; only a hint since formats are told by content.
SUPPORTED_EXTENSIONS: tuple[str, ...] = HINT_EXTENSIONS
_SHOWN = 5  # problem files named in one message
#: The most rows of one Parquet shard: a larger row group is cut into pieces of at most this many.
PARQUET_SHARD_ROWS = 65536

# Workers read many tasks from the same few files: keep their indexes.
_CACHE_SIZE = 32
_cache: OrderedDict[tuple[str, int, int], Reader] = OrderedDict()
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class DataOptions:
    """How a data path is read: the JobSpec's ``skip_unknown_files``, ``csv_header`` and ``columns``."""

    skip_unknown_files: bool = False  # warn about files that are not data instead of failing
    csv_header: bool = False  # the first line of each CSV file is a header, not a record
    columns: tuple[str, ...] | None = None  # the columns every Parquet file must have (the module's `columns`)

    def __post_init__(self) -> None:
        if self.columns is not None:
            object.__setattr__(self, "columns", _column_names(self.columns))

    @classmethod
    def of(cls, spec, *, columns: Sequence[str] | None = None) -> DataOptions:
        """The options of a JobSpec's data section (or anything with those attributes); ``columns``, the
        module's (a JobSpec's data section has none), take the place of the section's."""
        return cls(skip_unknown_files=bool(getattr(spec, "skip_unknown_files", False)),
                   csv_header=bool(getattr(spec, "csv_header", False)),
                   columns=columns if columns is not None else getattr(spec, "columns", None))


def _column_names(columns: Sequence[str]) -> tuple[str, ...]:
    if isinstance(columns, str):
        columns = (columns,)
    names = tuple(columns)
    if not all(isinstance(c, str) for c in names):
        raise TypeError(f"columns must be column names (strings), not {names!r}")
    return names


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


def open_reader(path: str | os.PathLike[str]) -> Reader:
    """Return a (cached) reader for one data file of any name, its format told by content.

    Raises DataError for a missing file or one that is not RecordIO, CSV or
    Parquet, CorruptRecordIOError (a DataError) for a structurally damaged
    RecordIO file and DataError for a Parquet file whose footer is damaged.
    Readers are cached by absolute path, size and mtime, so a file that is
    rewritten is re-sniffed and re-indexed instead of served from a stale
    index. A CSV reader returns every line: a header is left
    out by the shards (see :func:`make_shards`), so workers need no options.
    """
    return _open(os.fspath(path), None)


def _open(path: str, kind: str | None) -> Reader:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    if stat.S_ISDIR(st.st_mode):  # (the stat above, not a second one: a worker opens its file every step)
        raise DataError(f"expected a data file but found a directory: {path}")
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    with _cache_lock:
        reader = _cache.get(key)
        if reader is not None:
            _cache.move_to_end(key)
            return reader
    # Sniff and index outside the lock: it does I/O, and two threads racing on the
    # same file just both build an index (harmless).
    kind = kind or sniff(path)
    try:
        reader = (CSVReader(path) if kind == CSV else ParquetReader(path) if kind == PARQUET
                  else RecordIOReader(path))  # EMPTY: a 0-record RecordIO file
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except PermissionError as exc:
        raise DataError(f"data file {path} cannot be read ({exc.strerror})") from None
    with _cache_lock:
        _cache[key] = reader
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return reader


def clear_reader_cache() -> None:
    """Drop all cached readers and the decoded chunks of the record cache (for tests and long-lived processes)."""
    with _cache_lock:
        _cache.clear()
    record_cache().clear()


def _listing(directory: str) -> list[str]:
    """A directory's entries to classify: all but dot-files, subdirectories and a converted directory's schema."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise DataError(f"data directory {directory} cannot be listed ({exc.strerror})") from None
    paths = (os.path.join(directory, name) for name in names if not name.startswith(".") and name != SCHEMA_FILE)
    return [p for p in paths if not os.path.isdir(p)]


def _expand_one(part: str, what: str, *, in_list: bool) -> list[str]:
    if os.path.lexists(part):
        return _listing(part) if os.path.isdir(part) else [part]
    if glob.has_magic(part):
        matches = sorted(glob.glob(part))
        if not matches:
            raise DataError(f"{what} pattern {part} matches no file")
        # what a comma list of the matches names: a matched directory gives its files ('data/day-*')
        return [f for p in matches
                for f in (_listing(p) if os.path.isdir(p) else [p] if os.path.basename(p) != SCHEMA_FILE else [])]
    kind = "file" if in_list or _extension(part) in HINT_EXTENSIONS else "directory"
    raise DataError(f"{what} {kind} not found: {part}")


def _candidates(path: str, what: str) -> list[str]:
    """The files a data path names: a file, a directory, a glob, or a comma-separated list of them."""
    if os.path.lexists(path) or "," not in path:
        return _expand_one(path, what, in_list=False)
    files: list[str] = []
    for part in (p.strip() for p in path.split(",")):
        if part:
            files += [f for f in _expand_one(part, what, in_list=True) if f not in files]
    if not files:
        raise DataError(f"{what} {path!r} names no file")
    return files


def _problems(items: list[tuple[str, str]]) -> str:
    text = "; ".join(f"{file}: {reason}" for file, reason in items[:_SHOWN])
    return text + (f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _classify(path: str, what: str, options: DataOptions) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(files with their kind, skipped files with the reason)`` of a data path; raises DataError."""
    found, bad = [], []
    for file in _candidates(path, what):
        try:
            found.append((file, sniff(file)))
        except NotDataError as exc:
            bad.append((file, exc.reason))
    odd = odd_csv_files([file for file, kind in found if kind == CSV])
    if odd:
        found = [(file, kind) for file, kind in found if file not in dict(odd)]
        bad = bad + odd
    if bad and not options.skip_unknown_files:
        if len(bad) == 1 and bad[0][0] == path:  # the one file given
            raise DataError(f"{what} file {path} is not {FORMATS} data: {bad[0][1]}")
        many = f"{len(bad)} files are" if len(bad) > 1 else "a file is"
        raise DataError(f"{what} {path}: {many} not {FORMATS} data: {_problems(bad)}; remove "
                        f"{'them' if len(bad) > 1 else 'it'} or pass --skip-unknown-files to skip such files")
    first = {}
    for file, kind in found:
        if kind != EMPTY:
            first.setdefault(kind, file)
    if len(first) > 1:
        kinds = [k for k in (RECORDIO, CSV, PARQUET) if k in first]
        raise DataError(f"{what} {path} mixes {' and '.join(kinds)} files ("
                        + ", ".join(f"{first[k]} is {k}" for k in kinds) + "): one data path must hold one format")
    if not found:
        where = "directory" if os.path.isdir(path) else "path"
        skipped = f" ({len(bad)} skipped: {_problems(bad)})" if bad else ""
        raise DataError(f"{what} {where} {path} contains no data files{skipped} ({FORMATS} files, told by "
                        "their content)")
    return found, bad


def skipped_warning(what: str, path: str, skipped: list[tuple[str, str]]) -> str:
    """The one-line warning about the files --skip-unknown-files skipped."""
    return (f"{what} {path}: skipped {len(skipped)} file{'s' if len(skipped) > 1 else ''} that "
            f"{'are' if len(skipped) > 1 else 'is'} not {FORMATS} data (--skip-unknown-files): "
            + "; ".join(f"{file}: {reason}" for file, reason in skipped))


def list_data_files(path: str | os.PathLike[str], *, what: str = "data",
                    options: DataOptions | None = None) -> list[str]:
    """Resolve a user-given data path to the list of files to read (see the module docstring).

    ``what`` names the data in error messages, e.g. ``"training data"``.
    """
    found, _ = _classify(os.fspath(path), what, options or DataOptions())
    return [file for file, _ in found]


def make_shards(path: str | os.PathLike[str], *, what: str = "data", options: DataOptions | None = None,
                skipped: list[str] | None = None) -> list[Shard]:
    """One shard per data file under ``path`` covering all of its records.

    With ``options.csv_header`` a CSV shard starts at record 1, so the header
    is never a record (record ``i`` of a CSV source is always its ``i``-th row,
    blank lines not counted).
    A Parquet file gives one shard per row group, cut into pieces of at most
    ``PARQUET_SHARD_ROWS`` rows; with ``options.columns`` every Parquet file
    must have those columns (DataError naming the file and the ones missing).
    Files without records are left out; raises DataError if no file holds
    any record (a job over such data could never make progress). Files
    skipped under ``options.skip_unknown_files`` give one warning line,
    appended to ``skipped`` if given, else logged.
    """
    options = options or DataOptions()
    path = os.fspath(path)
    if is_sql_url(path):
        from flextrain.data.sql import make_sql_shards

        return [Shard(*shard) for shard in make_sql_shards(path, what=what, columns=options.columns)]
    found, bad = _classify(path, what, options)
    if bad:
        warning = skipped_warning(what, path, bad)
        if skipped is None:
            log.warning("%s", warning)
        else:
            skipped.append(warning)
    shards = []
    lacking: list[str] = []  # Parquet files without the module's columns: all named at once, not the first
    for file, kind in found:
        shards += _file_shards(file, kind, options, lacking)
    if len(lacking) == 1:
        raise DataError(lacking[0])
    if lacking:
        raise DataError(f"{what} {path}: {len(lacking)} Parquet files lack columns the module's `columns` "
                        f"names: {'; '.join(lacking[:_SHOWN])}"
                        + (f"; and {len(lacking) - _SHOWN} more" if len(lacking) > _SHOWN else ""))
    if not shards:
        raise DataError(
            f"{what}: the file set under {path} holds no records "
            f"({len(found)} file{'s' if len(found) != 1 else ''}, all empty"
            f"{' or a CSV header only' if options.csv_header else ''})"
        )
    return shards


def _file_shards(file: str, kind: str, options: DataOptions, lacking: list[str]) -> list[Shard]:
    reader = _open(file, kind)
    if isinstance(reader, ParquetReader):
        # The footer's schema, already read: checking every file costs nothing more. A file without
        # rows is never read, so its schema cannot fail a task.
        problem = reader.columns_problem(options.columns) if options.columns is not None else None
        if problem and reader.num_records:
            lacking.append(problem)
        return [Shard(file, lo, hi) for lo, hi in shard_ranges(reader, PARQUET_SHARD_ROWS)]
    n = reader.num_records
    start = 1 if kind == CSV and options.csv_header else 0
    return [Shard(file, start, n)] if n > start else []


def read_shard_range(source: str | os.PathLike[str], start: int, end: int, *,
                     columns: Sequence[str] | None = None,
                     as_batch: bool = False) -> list[bytes] | list[dict[str, Any]] | RecordBatch:
    """Records ``[start, end)`` of ``source`` (files via the reader cache).

    RecordIO and CSV records are ``bytes``; Parquet and SQL table records are row
    dicts, with ``columns`` only those columns (read by projection; ignored for the
    other formats, which have no columns). ``as_batch``: ``bytes`` records come as a
    :class:`RecordBatch` (no object per record; RecordIO's viewed in place), row dicts
    as the list still.
    """
    return shard_reader(source, columns=columns, as_batch=as_batch)(start, end)


def shard_reader(source: str | os.PathLike[str], *, columns: Sequence[str] | None = None,
                 as_batch: bool = False) -> Callable[[int, int], Any]:
    """``read(start, end)``: :func:`read_shard_range` of ``source`` with the source's reader found
    once (its format, the cache lookup and the file's ``stat``), for a caller that reads many
    ranges of one file in a row, e.g. a worker's steps of one task."""
    if is_sql_url(source):
        from flextrain.data.sql import read_sql_range

        names = None if columns is None else _column_names(columns)
        return lambda start, end: read_sql_range(source, start, end, columns=names)
    reader = open_reader(source)
    if isinstance(reader, ParquetReader):
        names = None if columns is None else _column_names(columns)
        return lambda start, end: reader.records(start, end, columns=names)
    if as_batch:
        if isinstance(reader, RecordIOReader):
            return reader.batch
        return lambda start, end: RecordBatch.of(reader.records(start, end))
    return reader.records
