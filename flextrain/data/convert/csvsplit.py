"""A CSV file cut into byte ranges of whole lines, so that pool workers parse their own shards.

:func:`plan_csv` (in the calling process) memory-maps the file, finds its line
ends with numpy in large blocks, reads the header (or the first record), and
counts the records: it never parses the body. :func:`shard_tasks` turns a
shard size into ``(index, byte_start, byte_end, first_line)`` per shard, the
shard boundaries exactly those of the whole-file path (record ``i`` is the
``i``-th non-blank line after the header). In a worker :func:`parse_range`
parses one range (ragged lines named by their 1-based line in the file) and
:func:`parse_columns` gives its columns with each column's kind over those
rows (or with given kinds). The kinds of ranges merge
by :func:`merge_kinds` (int64 < float64 < string): a column is int64 only if
every value in the file is an integer.

A line is a record only where a newline cannot be inside a field: a file
holding a double quote (``"``, the csv quote character) or a carriage return
that is not followed by a newline gets no plan (``None``) and is parsed whole
by :func:`flextrain.data.convert.tabular.open_csv`, as before.
"""

from __future__ import annotations

import csv
import io
import itertools
import mmap
import os
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from flextrain.data.convert.tabular import is_number
from flextrain.data.csv import BOM
from flextrain.data.errors import DataError

__all__ = ["CsvPlan", "plan_csv", "shard_tasks", "read_range", "parse_range", "parse_columns", "merge_kinds", "KINDS"]

KINDS = ("int64", "float64", "string")  # each holds every value of the ones before it
_BLOCK = 64 * 1024 * 1024  # bytes scanned at a time for line ends
_NL, _CR, _QUOTE = 10, 13, ord('"')


@dataclass(frozen=True)
class CsvPlan:
    """A CSV file's column ``names`` (``width`` of them, as on line ``first_line``), its records' byte
    ranges (``starts``/``ends``, record ``i`` on 1-based line ``lines[i]``)."""

    path: str
    names: tuple[str, ...]
    width: int
    first_line: int
    starts: np.ndarray
    ends: np.ndarray
    lines: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.starts)


def plan_csv(path: str, *, header: bool | None = None) -> CsvPlan | None:
    """The plan of ``path``, or None where a newline may sit inside a quoted field (or the file is empty)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                try:
                    return _plan(path, mm, header)
                except DataError as exc:
                    # Raised outside the mapping: the error's traceback holds _plan's numpy view of it,
                    # and closing a map with a view still exported is a BufferError that hid this one.
                    failure = exc.with_traceback(None)
            raise failure
    except OSError as exc:
        raise DataError(f"source {path} cannot be read ({exc.strerror})") from None


def _plan(path: str, mm: mmap.mmap, header: bool | None) -> CsvPlan | None:
    if mm.find(b'"') != -1:
        return None
    data = np.frombuffer(mm, np.uint8)
    size = len(data)
    ends = []
    for lo in range(0, size, _BLOCK):
        block = data[lo:lo + _BLOCK]
        cr = np.flatnonzero(block == _CR)
        if len(cr) and (cr[-1] + lo + 1 >= size or not np.all(data[cr + lo + 1] == _NL)):
            return None  # a lone carriage return ends a line for the csv module: parsed whole
        ends.append(np.flatnonzero(block == _NL) + lo)
    ends = np.concatenate(ends)
    if not len(ends) or ends[-1] != size - 1:
        ends = np.append(ends, size)  # the last line has no newline
    # A UTF-8 byte order mark (Excel's exports) is no part of the first line, as for CSVReader in training.
    starts = np.concatenate(([len(BOM) if mm[:len(BOM)] == BOM else 0], ends[:-1] + 1))
    lines = np.arange(1, len(starts) + 1)
    length = ends - starts
    crlf = np.zeros(len(starts), bool)
    crlf[length == 1] = data[starts[length == 1]] == _CR
    keep = (length > 0) & ~crlf  # blank lines are no records
    starts, ends, lines = starts[keep], ends[keep], lines[keep]
    head = [_parse_line(path, mm, int(s), int(e), int(n)) for s, e, n in zip(starts[:2], ends[:2], lines[:2])]
    if header is None:
        header = bool(head) and not any(map(is_number, head[0])) and (len(head) == 1 or any(map(is_number, head[1])))
    width = len(head[0]) if head else 0
    names = tuple(c.strip() or f"c{i}" for i, c in enumerate(head[0])) if header and head else \
        tuple(f"c{i}" for i in range(width))
    if len(set(names)) != len(names):
        raise DataError(f"{path}: the header names a column twice: {list(names)}")
    first_line = int(lines[0]) if len(lines) else 1
    if header and head:
        starts, ends, lines = starts[1:], ends[1:], lines[1:]
    if not len(starts):
        raise DataError(f"{path} holds no records")
    return CsvPlan(path, names, width, first_line, starts, ends, lines)


def _parse_line(path: str, mm: mmap.mmap, start: int, end: int, line: int) -> list[str]:
    [row] = parse_range(path, bytes(mm[start:end]), start, line, width=None, first_line=line)
    return row


def shard_tasks(plan: CsvPlan, shard_size: int) -> list[tuple[int, int, int, int, int]]:
    """``(index, records, byte_start, byte_end, first_line)`` of each shard of ``shard_size`` records."""
    tasks = []
    for index, lo in enumerate(range(0, plan.num_rows, shard_size)):
        hi = min(lo + shard_size, plan.num_rows)
        tasks.append((index, hi - lo, int(plan.starts[lo]), int(plan.ends[hi - 1]), int(plan.lines[lo])))
    return tasks


def read_range(path: str, start: int, end: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def parse_range(path: str, raw: bytes, offset: int, line: int, *, width: int | None, first_line: int
                ) -> list[list[str]]:
    """The non-blank rows of ``raw`` (bytes ``offset``.. of ``path``, starting on 1-based ``line``), each
    checked to hold ``width`` fields (``first_line``'s count; None: not checked)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc.reason} at byte {offset + exc.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = []
    try:
        for row in reader:
            if len(row) != width and width is not None:
                if not row:
                    continue  # a blank line
                raise DataError(f"{path}, line {line + reader.line_num - 1}: {len(row)} field(s), but line "
                                f"{first_line} has {width} (a ragged CSV line)")
            if row:
                rows.append(row)
    except csv.Error as exc:
        raise DataError(f"{path}: not CSV ({exc})") from None
    return rows


def parse_columns(rows: list[list[str]], names: tuple[str, ...], kinds: tuple[str, ...] | None = None
                  ) -> tuple[tuple[str, ...], dict[str, object]]:
    """``(kinds, columns)`` of ``rows``: each column int64 if every value is an integer, float64 if a number,
    else string (``kinds`` given: those, every value parsing as its column's kind)."""
    n, width = len(rows), len(names)
    flat = None
    if kinds is None or "string" not in kinds:
        try:  # the common case first: every value a number, parsed in one flat pass
            flat = np.fromiter(map(float, itertools.chain.from_iterable(rows)), np.float64, n * width)
            flat = flat.reshape(n, width)
        except ValueError:
            pass
    found, out = [], {}
    for j, name in enumerate(names):
        kind = kinds[j] if kinds else None
        if flat is not None and (kind == "float64" or kind is None and not _is_int(rows[0][j])):
            found.append("float64")
            out[name] = flat[:, j]
            continue
        values = list(map(itemgetter(j), rows))
        for k, parse in (("int64", int), ("float64", float)):
            if kind in (None, k):
                col = flat[:, j] if k == "float64" and flat is not None else _parse(parse, k, values, kind)
                if col is not None:
                    found.append(k)
                    out[name] = col
                    break
        else:
            found.append("string")
            out[name] = values
    return tuple(found), out


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _parse(parse, dtype: str, values: list[str], given: str | None):
    """The values as ``dtype``, or None where one does not parse (and ``given`` is None: inferring)."""
    try:
        return np.fromiter(map(parse, values), dtype, len(values))
    except (ValueError, OverflowError):
        if given is not None:
            raise
        return None


def merge_kinds(kinds: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The kinds of the whole file from those of its ranges: the widest of each column."""
    return tuple(KINDS[max(KINDS.index(k) for k in column)] for column in zip(*kinds))
