"""Which parameter server owns what: the routing rule shared by PS and workers.

This module is part of the wire contract (``proto/ps.proto`` describes it), so
it depends on nothing but the standard library and numpy, and its results
must never change between processes, machines or releases:

* a dense parameter goes to ``crc32(name as UTF-8) % num_ps``. Python's
  ``hash`` is salted per process (PYTHONHASHSEED) and would route the same
  name to different servers in different workers.
* an embedding row goes to ``mix64(id) % num_ps`` where ``mix64`` is the
  splitmix64 finaliser. A plain ``id % num_ps`` would put all ids of a strided
  family (hashed feature ids are often all even, or multiples of a bucket
  count) on one server; the mix spreads any such pattern evenly.
"""

from __future__ import annotations

import zlib

import numpy as np

INT64_MAX = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _check_num_ps(num_ps: int) -> None:
    if num_ps < 1:
        raise ValueError(f"num_ps must be >= 1, got {num_ps}")


def dense_owner(name: str, num_ps: int) -> int:
    """Index of the PS holding dense parameter ``name``."""
    _check_num_ps(num_ps)
    return zlib.crc32(name.encode("utf-8")) % num_ps


def _mix64(x: int) -> int:
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def mix64_array(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser over a uint64 array (wrapping arithmetic, no copies of the input)."""
    x = values.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(_M1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(_M2)
    x ^= x >> np.uint64(31)
    return x


def row_owner(row_id: int, num_ps: int) -> int:
    """Index of the PS holding embedding row ``row_id`` (0 <= row_id <= int64 max)."""
    _check_num_ps(num_ps)
    if not 0 <= row_id <= INT64_MAX:
        raise ValueError(f"embedding id {row_id} is out of range [0, {INT64_MAX}]")
    return _mix64(row_id) % num_ps


def row_owners(ids: np.ndarray, num_ps: int) -> np.ndarray:
    """Vectorised :func:`row_owner` for an int64 array of (already validated) ids."""
    _check_num_ps(num_ps)
    if num_ps == 1:
        return np.zeros(len(ids), dtype=np.int64)
    return (mix64_array(ids.view(np.uint64) if ids.dtype == np.int64 else ids) % np.uint64(num_ps)).astype(np.int64)


def distinct_by_owner(ids: np.ndarray, num_ps: int) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, inverse)`` of validated int64 ``ids``: the distinct ids grouped by owning
    PS (PS 0's first), ascending within each group, and ``distinct[inverse] == ids``.

    The PS trainers pull and push rows in this order: every PS's rows are then one
    contiguous range of the pulled rows and of their gradients (see :func:`owner_bounds`),
    which the client moves without gathering or scattering them.
    """
    distinct, inverse = np.unique(ids, return_inverse=True)
    if num_ps > 1 and len(distinct) > 1:
        order = np.argsort(row_owners(distinct, num_ps).astype(np.uint16 if num_ps <= 1 << 16 else np.int64),
                           kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        distinct, inverse = distinct[order], rank[inverse.reshape(-1)]
    return distinct, inverse.reshape(-1)


def owner_bounds(ids: np.ndarray, owners: np.ndarray, num_ps: int) -> np.ndarray | None:
    """Where each PS's ids start and end (``num_ps + 1`` offsets) when ``ids`` are laid out
    as :func:`distinct_by_owner` gives them, else None. ``owners``: ``row_owners(ids)``."""
    if len(owners) > 1 and not bool(np.all(owners[1:] >= owners[:-1])):
        return None
    bounds = np.searchsorted(owners, np.arange(num_ps + 1))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi - lo > 1 and not bool(np.all(ids[lo + 1: hi] > ids[lo: hi - 1])):
            return None
    return bounds


def dense_partition(names, num_ps: int) -> list[list[str]]:
    """``names`` split into one list per PS (order kept within each list)."""
    parts: list[list[str]] = [[] for _ in range(num_ps)]
    for name in names:
        parts[dense_owner(name, num_ps)].append(name)
    return parts


def as_row_ids(ids, table: str) -> np.ndarray:
    """``ids`` (list, numpy or torch) as a 1-D int64 array, or ValueError naming ``table`` and the id.

    Ids must be integers in ``[0, 2**63 - 1]``: negative ids and ids beyond
    int64 (which numpy would hold as uint64 or Python objects) are rejected
    rather than silently wrapped onto some other row.
    """
    if hasattr(ids, "detach"):  # a torch tensor; avoid importing torch here
        ids = ids.detach().cpu().numpy()
    try:
        arr = np.asarray(ids)
    except OverflowError:  # numpy cannot hold some of them in any integer dtype
        arr = np.asarray(list(ids), dtype=object)
    arr = arr.reshape(-1)
    if arr.dtype == object:
        for value in arr.tolist():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"embedding table {table!r}: ids must be integers, got {value!r}")
            if not 0 <= value <= INT64_MAX:
                raise ValueError(f"embedding table {table!r}: id {value} is out of range [0, {INT64_MAX}]")
        return arr.astype(np.int64)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind == "u":
        if arr.max() > INT64_MAX:
            raise ValueError(f"embedding table {table!r}: id {int(arr.max())} is out of range [0, {INT64_MAX}]")
        return arr.astype(np.int64)
    if arr.dtype.kind != "i":
        raise ValueError(f"embedding table {table!r}: ids must be integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError(f"embedding table {table!r}: id {int(arr.min())} is out of range [0, {INT64_MAX}] "
                         f"(negative ids are not allowed)")
    return arr.astype(np.int64, copy=False)
