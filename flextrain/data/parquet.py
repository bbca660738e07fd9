"""Random access to the rows of a Parquet file, one record (a dict) per row.

A Parquet file is stored as *row groups*: runs of rows whose columns are
compressed and read together. :class:`ParquetReader` reads the file's footer
once (row counts, schema) and then serves any row range ``[start, end)`` by
reading only the row groups that overlap it, and only the columns asked for
(projection). Each row comes back as a dict, column name -> Python value
(``pyarrow``'s ``to_pylist``: nulls are ``None``, list columns lists, structs
dicts, floats Python floats).

:func:`shard_ranges` says how a Parquet file becomes shards: one per row
group, a large row group cut into pieces of at most ``max_rows`` rows, so a
task never straddles two row groups and reading it decodes one row group.

pyarrow is imported lazily (on the first Parquet file), so the rest of the
data layer never pays for it.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from typing import Any

from flextrain.data._ranges import check_range
from flextrain.data.errors import DataError

__all__ = ["ParquetReader", "shard_ranges"]

_SHOWN_COLUMNS = 20  # column names listed in one message


def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
        raise DataError(f"reading Parquet files needs pyarrow, which cannot be imported ({exc})") from None
    return pq


def _damaged(path: str, exc: BaseException, what: str = "") -> DataError:
    return DataError(f"damaged Parquet file {path}{what}: {exc}")


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN_COLUMNS])
    return shown + (f", and {len(names) - _SHOWN_COLUMNS} more" if len(names) > _SHOWN_COLUMNS else "")


class ParquetReader:
    """Row-range reads of one Parquet file.

    Contract:
      * ``num_records`` is the file's row count; record ``i`` is row ``i``.
      * ``records(start, end, columns=...)`` returns one dict per row; with
        ``columns`` only those keys (in that order), read from the file by
        projection. Unknown columns raise DataError naming the file, the
        missing columns and the columns it has.
      * A damaged file raises DataError naming it and pyarrow's reason: at
        construction if its footer cannot be read, else at the read that meets
        the damage.
      * The file must not change after the reader is created.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self._path = os.fspath(path)
        pq = _pq()
        try:
            self._metadata = pq.read_metadata(self._path)
            self._columns = list(self._metadata.schema.to_arrow_schema().names)
        except (FileNotFoundError, PermissionError):
            raise
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError and friends
            raise _damaged(self._path, exc) from None
        meta = self._metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._starts = [0]
        for size in sizes:
            self._starts.append(self._starts[-1] + size)

    @property
    def path(self) -> str:
        return self._path

    @property
    def num_records(self) -> int:
        return self._starts[-1]

    def __len__(self) -> int:
        return self.num_records

    @property
    def columns(self) -> list[str]:
        """The file's (top-level) column names, in schema order."""
        return list(self._columns)

    @property
    def row_groups(self) -> list[tuple[int, int]]:
        """The row range ``(start, end)`` of each row group, in file order."""
        return list(zip(self._starts, self._starts[1:]))

    def __repr__(self) -> str:
        return (f"ParquetReader({self._path!r}, num_records={self.num_records}, "
                f"row_groups={len(self._starts) - 1}, columns={self._columns!r})")

    def missing_columns(self, columns: Sequence[str]) -> list[str]:
        """The names in ``columns`` the file does not have."""
        have = set(self._columns)
        return [c for c in columns if c not in have]

    def columns_problem(self, columns: Sequence[str]) -> str | None:
        """What is wrong with reading ``columns`` from this file (its name, the columns it lacks and those
        it has), or None when it has them all."""
        if isinstance(columns, str):
            raise TypeError(f"columns must be a sequence of column names, not the string {columns!r}")
        missing = self.missing_columns(columns)
        if not missing:
            return None
        return (f"Parquet file {self._path} has no column{'s' if len(missing) > 1 else ''} "
                f"{_names(missing)} (its columns: {_names(self._columns)})")

    def check_columns(self, columns: Sequence[str]) -> None:
        """Raise DataError naming the file and the columns of ``columns`` it lacks."""
        problem = self.columns_problem(columns)
        if problem:
            raise DataError(problem)

    def records(self, start: int, end: int, *, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Rows ``[start, end)`` as dicts, reading only the overlapping row groups and the given columns."""
        start, end = check_range(self._path, start, end, self.num_records)
        if columns is not None:
            self.check_columns(columns)
            columns = list(dict.fromkeys(columns))
        if start == end:
            return []
        first = bisect.bisect_right(self._starts, start) - 1
        last = bisect.bisect_left(self._starts, end) - 1  # the row group holding row end - 1
        groups = list(range(first, last + 1))
        where = f" (rows [{start}, {end}), row groups {first}..{last})"
        try:
            with _pq().ParquetFile(self._path, metadata=self._metadata) as file:
                table = file.read_row_groups(groups, columns=columns, use_threads=False)
            rows = table.slice(start - self._starts[first], end - start).to_pylist()
        except (FileNotFoundError, PermissionError) as exc:
            raise DataError(f"Parquet file {self._path} cannot be read ({exc.strerror})") from None
        except DataError:
            raise
        except Exception as exc:
            raise _damaged(self._path, exc, where) from None
        if len(rows) != end - start:  # a footer that promises rows the data does not hold
            raise _damaged(self._path, ValueError(f"{len(rows)} rows read, {end - start} expected"), where)
        return rows


def shard_ranges(reader: ParquetReader, max_rows: int) -> list[tuple[int, int]]:
    """Row ranges of the shards of a Parquet file: one per non-empty row group, cut into pieces of at most
    ``max_rows`` rows (equal-sized but for the last)."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, not {max_rows}")
    ranges = []
    for lo, hi in reader.row_groups:
        ranges += [(s, min(s + max_rows, hi)) for s in range(lo, hi, max_rows)]
    return ranges
