"""Record-indexed random access to CSV files: one record per CSV row, as ``flextrain data convert`` reads it.

The reader never parses CSV fields: records are the raw bytes of each row,
and decoding them is the model's business (like RecordIO records). What a
record is matches Python's ``csv`` module (the excel dialect that ``flextrain
data convert`` parses with), so training and conversion count the same rows:

* a row ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (old Mac files) outside
  a quoted field; a quoted field may hold line breaks, kept in the record;
* blank lines are no records, anywhere in the file;
* a leading UTF-8 byte order mark (Excel's exports) is not part of record 0.
"""

from __future__ import annotations

import csv
import io
import mmap
import os
from collections.abc import Iterator

import numpy as np

from flextrain.data._ranges import check_range
from flextrain.data.errors import DataError

__all__ = ["CSVReader", "BOM"]

BOM = b"\xef\xbb\xbf"
_BLOCK = 8 << 20  # bytes scanned at a time: numpy temporaries stay small for arbitrarily big files
_NL, _CR, _QUOTE, _COMMA = 10, 13, 34, 44
# What may stand before a quote that opens a quoted field, and after one that closes it: anything
# else is a quote the csv module takes literally (``5" tall``), which quote parity gets wrong.
_QUOTE_NEIGHBOURS = np.zeros(256, bool)
_QUOTE_NEIGHBOURS[[_COMMA, _NL, _CR, _QUOTE]] = True


class CSVReader:
    """Random access to the rows of a CSV file, one record per row.

    Construction scans the file once and remembers where each record starts
    and ends (16 bytes per record). ``read(start, end)`` then seeks straight
    to record ``start`` and reads only the bytes of the requested records.

    Contract:
      * ``num_records`` counts rows: with ``header=True`` the first row is
        excluded; blank lines are not rows.
      * Records are the row's bytes without its final line break (and without
        a leading byte order mark).
      * The file must not change after the reader is created.
    """

    def __init__(self, path: str | os.PathLike[str], *, header: bool = False):
        self._path = os.fspath(path)
        self._header = header
        self._starts, self._ends = self._index()

    @property
    def path(self) -> str:
        return self._path

    @property
    def header(self) -> bool:
        return self._header

    @property
    def num_records(self) -> int:
        return len(self._starts)

    def __len__(self) -> int:
        return self.num_records

    def __repr__(self) -> str:
        return f"CSVReader({self._path!r}, header={self._header}, num_records={self.num_records})"

    def read(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Yield the records ``[start, end)`` (``end=None``: to the last).

        Raises ValueError at call time if the range is out of bounds.
        """
        start, end = check_range(self._path, start, end, self.num_records)
        return self._iter_range(start, end)

    def records(self, start: int, end: int) -> list[bytes]:
        """Records ``[start, end)`` as a list."""
        return list(self.read(start, end))

    def __iter__(self) -> Iterator[bytes]:
        return self.read()

    def _iter_range(self, start: int, end: int) -> Iterator[bytes]:
        if start == end:
            return
        starts = self._starts[start:end].tolist()
        ends = self._ends[start:end].tolist()
        base = starts[0]
        with open(self._path, "rb") as f:
            f.seek(base)
            buf = f.read(ends[-1] - base)
        for lo, hi in zip(starts, ends):
            yield buf[lo - base:hi - base]

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)``: the byte range of each record, line break excluded."""
        with open(self._path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                starts = ends = np.zeros(0, np.int64)
            else:
                failure = None
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    data = np.frombuffer(mm, np.uint8)
                    try:
                        starts, ends = _rows(data) or _rows_by_csv_module(self._path, data)
                    except DataError as exc:
                        # Raised once the mapping is closed: the traceback holds views of it, and closing
                        # a map with a view still exported is a BufferError that would hide this error.
                        failure = exc.with_traceback(None)
                    del data
                if failure is not None:
                    raise failure
        if self._header and len(starts):
            starts, ends = starts[1:], ends[1:]
        return starts, ends


def _line_breaks(data: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``(at, after)`` of the line breaks in ``data[lo:hi]``: where each begins and the byte after it."""
    block = data[lo:hi]
    nl = np.flatnonzero(block == _NL) + lo
    cr = np.flatnonzero(block == _CR) + lo
    if not len(cr):  # the common case, \n only: no sorting
        at = nl.copy()
        if len(nl) and nl[0] == lo and lo and data[lo - 1] == _CR:
            at[0] -= 1  # a \r\n across the block edge
        return at, nl + 1
    lone = cr[(cr + 1 >= len(data)) | (data[np.minimum(cr + 1, len(data) - 1)] != _NL)]
    crlf = np.zeros(len(nl), bool)
    crlf[nl > 0] = data[nl[nl > 0] - 1] == _CR
    at = np.concatenate((nl - crlf, lone))
    after = np.concatenate((nl + 1, lone + 1))
    order = np.argsort(at, kind="stable")
    return at[order], after[order]


def _rows(data: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The records' byte ranges found with numpy, block by block (no Python loop over bytes or rows).

    A line break is inside a quoted field exactly when an odd number of quotes precede it, provided
    every quote sits where the csv module takes it as a quote: an opening one (an even number before
    it) at a field's start or right after a closing one (``""``, an escaped quote), a closing one at
    a field's end or before an opening one. None where some quote does not (or an odd number of them
    leaves a field open at the end): the caller falls back to the csv module.
    """
    size = len(data)
    first = len(BOM) if size >= len(BOM) and bytes(data[:len(BOM)]) == BOM else 0
    quotes = 0  # quotes before the block
    record_ends, next_starts = [], []
    for lo in range(first, size, _BLOCK):
        hi = min(lo + _BLOCK, size)
        q = np.flatnonzero(data[lo:hi] == _QUOTE) + lo
        if len(q):
            opening = (np.arange(quotes, quotes + len(q)) % 2) == 0
            o, c = q[opening], q[~opening]
            o = o[o > first]
            if not _QUOTE_NEIGHBOURS[data[o - 1]].all():
                return None
            c = c[c + 1 < size]
            if not _QUOTE_NEIGHBOURS[data[c + 1]].all():
                return None
        at, after = _line_breaks(data, lo, hi)
        if len(q):
            outside = (quotes + np.searchsorted(q, at)) % 2 == 0
            at, after = at[outside], after[outside]
        elif quotes % 2:
            at, after = at[:0], after[:0]  # the whole block is inside a quoted field
        record_ends.append(at)
        next_starts.append(after)
        quotes += len(q)
    if quotes % 2:
        return None
    return _ranges(np.concatenate(record_ends or [np.zeros(0, np.int64)]),
                   np.concatenate(next_starts or [np.zeros(0, np.int64)]), first, size)


def _ranges(ends: np.ndarray, after: np.ndarray, first: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Records from their ends and the starts after them, blank ones (no bytes) left out."""
    starts = np.concatenate(([first], after)).astype(np.int64)
    ends = np.concatenate((ends, [size])).astype(np.int64)  # the last row: to the end of the file
    keep = ends > starts
    return starts[keep], ends[keep]


def _rows_by_csv_module(path: str, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The records' byte ranges as the csv module (in C) splits the file's lines into rows.

    Only for files with quotes that quote parity cannot place (stray quotes inside unquoted fields, or
    one left open): a Python step per row, slower than :func:`_rows` but exact. Latin-1 maps each byte
    to one character, so line and quote positions are the file's whatever its encoding.
    """
    size = len(data)
    first = len(BOM) if bytes(data[:len(BOM)]) == BOM else 0
    breaks = [_line_breaks(data, lo, min(lo + _BLOCK, size)) for lo in range(first, size, _BLOCK)]
    at = np.concatenate([b[0] for b in breaks] or [np.zeros(0, np.int64)])
    after = np.concatenate([b[1] for b in breaks] or [np.zeros(0, np.int64)])
    if not len(after) or after[-1] != size:
        at, after = np.append(at, size), np.append(after, size)  # the last line has no line break
    line_starts = np.concatenate(([first], after[:-1]))
    starts, ends = [], []
    with open(path, "rb") as raw:
        raw.seek(first)
        reader = csv.reader(io.TextIOWrapper(raw, encoding="latin-1", newline=""))
        done, last = 0, []  # lines consumed before the row; the last row
        try:
            for row in reader:
                if row:
                    starts.append(line_starts[done])
                    ends.append(at[reader.line_num - 1])
                    last = row
                done = reader.line_num
        except csv.Error as exc:
            raise DataError(f"{path}, line {reader.line_num}: not CSV ({exc})") from None
    if ends and ends[-1] < size and _parse(data[starts[-1]:ends[-1]]) != last:
        ends[-1] = size  # a quote left open at the end: the csv module keeps the final line break in its field
    return np.array(starts, np.int64), np.array(ends, np.int64)


def _parse(raw: np.ndarray) -> list[str]:
    return next(csv.reader(io.StringIO(raw.tobytes().decode("latin-1"), newline="")), [])
