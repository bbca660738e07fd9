"""Embedding rows between a worker and the parameter servers: the row layout, pulls and sparse pushes.

The transport (retries, deadlines, errors, parallel fan-out) is the caller's:
:class:`flextrain.worker.ps_client.PSClient` passes its ``call`` and
``fanout``. Here, only what rows go where:

* **layout**: row ``id`` lives on PS ``row_owner(id)`` (:mod:`flextrain.protocol.shard`).
  :func:`distinct_rows` lays a batch's distinct ids out grouped by owning PS;
  ids in that layout are pulled straight into one range of the result per PS,
  any other ids are de-duplicated and scattered row by row.
* **pull** (:func:`pull_rows`): each PS streams its rows (PullEmbedding) in
  requests of at most ``MAX_IDS_PER_REQUEST`` ids; every block is checked
  against the request (dtype, width, count) and copied once, from the message
  to the row's place in the result. Repeated ids are fetched once. Per PS, the
  version of the first block of each request is recorded in ``row_versions``.
* **push** (:func:`sparse_push_blocks`): per table, gradient rows are summed
  by id and encoded into SparseBlocks per owning PS (:func:`flextrain.protocol.codec.sparse_blocks`).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import numpy as np
import torch

from flextrain.proto import ps_pb2 as pb
from flextrain.protocol.codec import distinct, dtype_name, empty_rows, ids_to_proto, sparse_blocks
from flextrain.protocol.shard import as_row_ids, distinct_by_owner, owner_bounds, row_owners
from flextrain.protocol.wire import decode_tensor, fields

MAX_IDS_PER_REQUEST = 384 * 1024  # 3 MiB of int64 ids: under the default 4 MiB message limit

# call(ps, what, attempt(stub, timeout), nbytes): one RPC attempt loop against PS ``ps``, returning attempt's result
Call = Callable[..., object]
# fanout(fn, ps_indices): [fn(i) for i in ps_indices], run in parallel
Fanout = Callable[[Callable[[int], object], Iterable[int]], list]


def distinct_rows(table: str, ids, num_ps: int) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, inverse)`` of ``table``'s ``ids`` (validated, flattened) grouped by owning PS;
    ``distinct[inverse]`` is ``ids``."""
    return distinct_by_owner(as_row_ids(ids, table), num_ps)


def pull_rows(table: str, flat: np.ndarray, shape: tuple[int, ...], *, dim: int, dtype: torch.dtype, num_ps: int,
              chunk_bytes: int, call: Call, fanout: Fanout, row_versions: list[int],
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of ``table`` for the validated ids ``flat``, as a tensor of ``shape + (dim,)``.

    ``row_versions[i]`` is set to PS ``i``'s version as each of its requests completes.
    A PS sending rows that do not fit the request raises ValueError naming the PS.
    ``out``: a contiguous CPU tensor of that shape and ``dtype`` (checked by :func:`check_out`) that
    receives the rows and is returned; without it a fresh tensor is allocated.
    """
    if not len(flat):
        return torch.empty((*shape, dim), dtype=dtype) if out is None else out
    # A fresh result is numpy-allocated (huge pages: several times fewer page faults than torch's).
    result = empty_rows(len(flat), dim, dtype).view(*shape, dim) if out is None else out
    row_bytes = dim * dtype.itemsize
    # Reusing the caller's tensor matters on VMs that hand freed memory back to the host:
    # first-touching a fresh 50 MB result costs the kernel ~10x the copy into it.
    out = result.view(torch.uint8).numpy().reshape(len(flat), row_bytes)
    row = np.dtype((np.void, row_bytes))
    slots = out.view(row).reshape(len(flat))  # a row as one item: scatters copy rows, not bytes
    owners = row_owners(flat, num_ps)
    bounds = owner_bounds(flat, owners, num_ps)
    if bounds is not None:  # laid out by distinct_by_owner: each PS's rows are one range of the result
        first = inverse = rep = wanted = None
        plain, counts = True, np.diff(bounds)
    else:
        # One position per distinct id; requests list ids in order of those positions, so
        # each PS's rows land in ascending places of the result (cache-friendly writes).
        first, inverse = distinct(flat)
        plain = first is inverse  # sorted and distinct: nothing to reorder
        rep = first if plain else np.sort(first)
        wanted, owners = (flat, owners) if plain else (flat[rep], owners[rep])
        counts = np.bincount(owners, minlength=num_ps)

    def one(i: int):
        if bounds is not None:
            base, mine = int(bounds[i]), None
            sorted_ids = flat[bounds[i]: bounds[i + 1]]
        else:
            # Each PS's share is picked out in its own thread (numpy lets go of the GIL), so
            # the first request leaves before the other PS's ids are even selected.
            base, mine = 0, np.flatnonzero(owners == i) if num_ps > 1 else np.arange(len(wanted))
            dest = mine if plain else rep[mine]  # where each requested row goes in the result
            sorted_ids = wanted[mine]
        for a in range(0, len(sorted_ids), MAX_IDS_PER_REQUEST):
            b = min(len(sorted_ids), a + MAX_IDS_PER_REQUEST)
            part = sorted_ids[a:b]
            req = pb.PullEmbeddingRequest(table=table, chunk_bytes=chunk_bytes, ids=ids_to_proto(part))

            def attempt(stub, timeout):
                pos, version = a, None
                for raw in stub.rows(req, timeout=timeout):  # read in place: rows = 1 (a Tensor)
                    block_version = 0  # 0 is not sent
                    for field, wt, value in fields(raw):
                        if field == 2 and wt == 0:
                            block_version = value
                        elif field == 1 and wt == 2:
                            got, shp, data = decode_tensor(value)
                            n = shp[0] if len(shp) == 2 else -1
                            if got != dtype_name(dtype) or n < 0 or shp[1] != dim or pos + n > b \
                                    or len(data) != n * row_bytes:
                                raise ValueError(f"parameter server {i} sent rows {got} {shp} that do not fit "
                                                 f"the request")
                            # Straight from the message to the rows' places in the result: one copy.
                            if mine is None:
                                slots[base + pos: base + pos + n] = np.frombuffer(data, row)
                            else:
                                slots[dest[pos: pos + n]] = np.frombuffer(data, row)
                            pos += n
                    if version is None:
                        version = block_version  # the first block's: later ones may be newer
                if pos != b:
                    raise ValueError(f"parameter server {i} sent {pos - a} of {b - a} rows")
                return version or 0
            row_versions[i] = call(i, "PullEmbedding", attempt, nbytes=(b - a) * row_bytes)

    fanout(one, [i for i in range(num_ps) if counts[i]])
    if first is not None and len(first) < len(flat):  # repeated ids: copy the row fetched for another
        src = first[inverse]
        again = np.nonzero(src != np.arange(len(flat)))[0]
        slots[again] = slots[src[again]]
    return result


def check_out(out: torch.Tensor, *, table: str, shape: tuple[int, ...], dim: int, dtype: torch.dtype) -> None:
    """ValueError unless ``out`` can receive ``table``'s rows for ids of ``shape`` in place."""
    want = (*shape, dim)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != dtype \
            or out.device.type != "cpu" or not out.is_contiguous() or out.requires_grad:
        got = (f"{tuple(out.shape)} {out.dtype} on {out.device}, contiguous={out.is_contiguous()}, "
               f"requires_grad={out.requires_grad}") if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"pull_embedding out= for table {table!r} must be a contiguous CPU tensor of shape {want} "
                         f"and dtype {dtype} without requires_grad; got {got}")


def sparse_push_blocks(sparse_grads: Mapping[str, tuple[object, torch.Tensor]], *, table_dim: Callable[[str], int],
                       num_ps: int, chunk_bytes: int) -> list[list]:
    """Per PS, the encoded SparseBlocks (``PushChunk{sparse}`` messages, as sent) of ``sparse_grads``:
    table -> (ids, rows [len(ids), dim]); duplicate ids are summed. ``table_dim(name)`` is the table's
    width (ValueError for an unknown table)."""
    blocks: list[list] = [[] for _ in range(num_ps)]
    for table, (ids, values) in sparse_grads.items():
        dim = table_dim(table)
        flat = as_row_ids(ids, table)
        for i, part in enumerate(sparse_blocks(table, flat, values.detach().cpu().reshape(len(flat), dim),
                                               num_ps, chunk_bytes)):
            blocks[i].append(part)
    return blocks
