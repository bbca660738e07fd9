"""A step's records without a Python object per record: what ``feed`` gets with ``record_batch = True``.

A worker's step reads a few hundred records. As a list, each becomes a ``bytes``
object, and a ``feed`` that decodes them with numpy joins them into one buffer
again: two copies of the step's data (~0.5 MB in ``bench/overhead.py``) before
the model sees it, which evict the model's weights from the cache and cost a
1-worker job ~3% of a 20 ms step against a loop over tensors held in memory.

:class:`RecordBatch` is the same records as a read-only sequence of ``bytes``
(``len``, indexing, slicing, iteration, ``b"".join`` all work as on the list),
plus :meth:`RecordBatch.array`: the records as a numpy structured array. When
the records are fixed-size and lie in one decoded RecordIO chunk (the common
case: a step's span inside a 32 MiB chunk), the array is a view of the reader's
decoded chunk: no copy at all, and ``torch.from_numpy`` of a field is a view
too. Otherwise the records are joined once.

:func:`records_array` does the same for a ``RecordBatch`` or any list of
``bytes``, so one ``feed`` serves both (a plain loop's list, a worker's batch).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RecordBatch", "records_array"]


class RecordBatch(Sequence):
    """Records as a read-only sequence of ``bytes``, made of pieces ``(records, lo, hi)``:
    ``records[lo:hi]`` of each piece in order. ``records`` is any sequence of ``bytes``
    that slices to a list; one that has ``strided(lo, hi)`` (a fixed-size RecordIO chunk)
    lets :meth:`array` view its memory instead of copying."""

    __slots__ = ("_pieces", "_ends")

    def __init__(self, pieces: Sequence[tuple[Sequence[bytes], int, int]]) -> None:
        self._pieces = [p for p in pieces if p[2] > p[1]]
        self._ends: list[int] = []
        total = 0
        for _, lo, hi in self._pieces:
            total += hi - lo
            self._ends.append(total)

    @classmethod
    def of(cls, records: Sequence[bytes]) -> RecordBatch:
        """A batch over a plain list of records (CSV lines, a test's records)."""
        return cls([(records, 0, len(records))])

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(self)[index] if index.step not in (None, 1) else self._slice(*index.indices(len(self))[:2])
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"record {index} of a batch of {n}")
        p = bisect.bisect_right(self._ends, index)
        records, lo, _ = self._pieces[p]
        return records[lo + index - (self._ends[p - 1] if p else 0)]

    def _slice(self, start: int, stop: int) -> list[bytes]:
        out: list[bytes] = []
        first = 0
        for (records, lo, hi), end in zip(self._pieces, self._ends):
            a, b = max(start, first), min(stop, end)
            if a < b:
                out += records[lo + a - first: lo + b - first]
            first = end
        return out

    def __iter__(self):
        for records, lo, hi in self._pieces:
            yield from records[lo:hi]

    def __repr__(self) -> str:
        return f"RecordBatch({len(self)} records in {len(self._pieces)} piece(s))"

    def array(self, dtype: Any) -> np.ndarray:
        """The records as a read-only numpy array of ``dtype`` (usually structured), one element
        per record; each record must be exactly ``dtype.itemsize`` bytes (ValueError otherwise).

        A view of the reader's decoded chunk when the batch is one piece of fixed-size records
        (no copy; the fields' strides are the records' stride, and the chunk stays alive while
        the array does); else the records joined once. ``torch.from_numpy`` of a field warns
        once per process that the array is not writable: the model must not write its inputs.
        """
        dtype = np.dtype(dtype)
        if len(self._pieces) == 1:
            records, lo, hi = self._pieces[0]
            strided = getattr(records, "strided", None)
            found = strided(lo, hi) if strided is not None else None
            if found is not None:
                buffer, stride, offset = found
                _check_size(stride - offset, dtype, len(self))
                wrapped = np.dtype({"names": ["r"], "formats": [dtype], "offsets": [offset], "itemsize": stride})
                return np.ndarray((hi - lo,), wrapped, buffer=buffer)["r"]
        return _joined(self, dtype)


def records_array(records: Sequence[bytes], dtype: Any) -> np.ndarray:
    """``records`` (a :class:`RecordBatch` or any sequence of ``bytes``) as a numpy array of
    ``dtype``, one element per record: a view where :meth:`RecordBatch.array` can make one,
    else one copy. ValueError if a record is not ``dtype.itemsize`` bytes."""
    if isinstance(records, RecordBatch):
        return records.array(dtype)
    return _joined(records, np.dtype(dtype))


def _joined(records: Sequence[bytes], dtype: np.dtype) -> np.ndarray:
    sizes = {len(r) for r in records}
    if sizes - {dtype.itemsize}:
        _check_size(max(sizes - {dtype.itemsize}), dtype, len(records))
    return np.frombuffer(b"".join(records), dtype=dtype)  # read-only, like the view


def _check_size(size: int, dtype: np.dtype, n: int) -> None:
    if size != dtype.itemsize:
        raise ValueError(f"records of {size} bytes cannot be read as {dtype} ({dtype.itemsize} bytes per "
                         f"record; {n} records)")
