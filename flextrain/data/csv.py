"""Line-indexed random access to CSV (or any newline-delimited text) files.

The reader never parses CSV fields: records are the raw bytes of each line,
and decoding them is the model's business (like RecordIO records). Lines end
with ``\\n`` or ``\\r\\n``; a bare ``\\r`` is not a line break. Quoted fields
spanning lines are not supported (each physical line is one record).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from flextrain.data._ranges import check_range

__all__ = ["CSVReader"]

_BLOCK = 1 << 20  # indexing read size: bounded memory for arbitrarily big files


class CSVReader:
    """Random access to the lines of a text file, one record per line.

    Construction scans the file once in binary mode and remembers where each
    line starts (8 bytes per line). ``read(start, end)`` then seeks straight
    to line ``start`` and reads only the bytes of the requested lines.

    Contract:
      * ``num_records`` counts data lines: with ``header=True`` the first line
        is excluded; a final empty line (i.e. the file ends with a newline)
        is not a record. Empty lines elsewhere are records (``b""``).
      * Records are the line bytes without ``\\n`` / ``\\r\\n``.
      * The file must not change after the reader is created.
    """

    def __init__(self, path: str | os.PathLike[str], *, header: bool = False):
        self._path = os.fspath(path)
        self._header = header
        self._bounds = self._index()

    @property
    def path(self) -> str:
        return self._path

    @property
    def header(self) -> bool:
        return self._header

    @property
    def num_records(self) -> int:
        return len(self._bounds) - 1

    def __len__(self) -> int:
        return self.num_records

    def __repr__(self) -> str:
        return f"CSVReader({self._path!r}, header={self._header}, num_records={self.num_records})"

    def read(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Yield the data lines ``[start, end)`` (``end=None``: to the last).

        Raises ValueError at call time if the range is out of bounds.
        """
        start, end = check_range(self._path, start, end, self.num_records)
        return self._iter_range(start, end)

    def records(self, start: int, end: int) -> list[bytes]:
        """Data lines ``[start, end)`` as a list."""
        return list(self.read(start, end))

    def __iter__(self) -> Iterator[bytes]:
        return self.read()

    def _iter_range(self, start: int, end: int) -> Iterator[bytes]:
        if start == end:
            return
        bounds = self._bounds[start : end + 1].tolist()
        base = bounds[0]
        # bounds[i + 1] - 1 is the position of line i's "\n" (or one past EOF
        # for an unterminated last line), so the read never includes the
        # following line.
        with open(self._path, "rb") as f:
            f.seek(base)
            buf = f.read(bounds[-1] - 1 - base)
        for lo, hi in zip(bounds, bounds[1:]):
            line = buf[lo - base : hi - 1 - base]
            if line.endswith(b"\r"):
                line = line[:-1]
            yield line

    def _index(self) -> np.ndarray:
        """Return ``bounds`` with ``bounds[i]`` = start offset of data line i
        and ``bounds[-1]`` = end of the last line + 1 (as if it ended in "\\n")."""
        starts = [np.zeros(1, dtype=np.int64)]
        size = 0
        with open(self._path, "rb") as f:
            while True:
                block = f.read(_BLOCK)
                if not block:
                    break
                newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 0x0A)
                starts.append(newlines.astype(np.int64) + (size + 1))
                size += len(block)
        bounds = np.concatenate(starts)
        if bounds[-1] != size:
            # The last line has no terminating newline: add a virtual one.
            bounds = np.append(bounds, size + 1)
        # Now bounds[-1] is one past the last newline; each consecutive pair
        # delimits one line. An empty file yields [0], i.e. zero lines.
        if self._header and len(bounds) > 1:
            bounds = bounds[1:]
        return bounds
