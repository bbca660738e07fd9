"""``flextrain data inspect``: what a directory of RecordIO shards holds.

:func:`inspect_dir` counts the records of every RecordIO file in the
directory with the reader, compares the counts with ``schema.json`` when
there is one, checks every chunk (CRC-32, decompression, framing) unless
told not to, and decodes the first records: with the schema
(:func:`flextrain.data.rows.decode_rows`), or without one as
``tf.train.Example`` if they parse as such, else as raw bytes (size and
first bytes). The result is plain JSON-able data.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from flextrain.data.errors import CorruptRecordIOError, DataError
from flextrain.data.formats import RECORDIO, NotDataError, sniff
from flextrain.data.recordio import RecordIOReader
from flextrain.data.rows import SCHEMA_FILE, Schema, decode_rows, load_schema

__all__ = ["inspect_dir", "readable"]

_SHOWN_VALUES = 8  # values of an array shown per field
_SHOWN_BYTES = 16
_CHUNK_HEADER = 20  # bytes before each chunk's payload (flextrain.data.recordio)


def inspect_dir(directory: str | os.PathLike[str], *, head: int = 3, verify: bool = True,
                on_start: Callable[[int], None] | None = None,
                on_progress: Callable[[int], None] | None = None) -> dict:
    """Schema, counts and the first ``head`` records of a converted directory (or any RecordIO files; or
    one RecordIO file, decoded with its directory's schema.json if there is one: no count is checked then).

    With ``verify`` every chunk of every shard is checked as a read would (CRC-32, decompression, record
    framing), one chunk at a time: a count from the chunk headers alone passes a shard whose payload is
    damaged, which then fails the job's task that reads it. ``on_start(total bytes)`` and
    ``on_progress(bytes)`` follow the check. A shard whose chunk headers are damaged is reported the same
    way (it cannot be counted), never raised.

    Returns ``{"directory", "schema" (None without schema.json), "records" (counted), "shards":
    [{"name", "records", "bytes"}], "agrees" (counts match the schema's; None without one),
    "disagreements" (what differs), "verified" (the chunks were checked), "corrupt": [{"name", "offset",
    "reason"}] (each damaged chunk found), "decoded_as" ("schema", "example" or "raw"), "head": [records]}``.
    """
    directory = os.fspath(directory)
    one = os.path.isfile(directory) and os.path.basename(directory) != SCHEMA_FILE
    if one:  # a single shard: the records of that file only
        directory, file_name = os.path.split(os.path.abspath(directory))
    elif not os.path.isdir(directory):
        raise DataError(f"not a directory or a RecordIO file: {directory}" if os.path.exists(directory) else
                        f"directory not found: {directory}")
    schema = load_schema(directory) if os.path.exists(os.path.join(directory, SCHEMA_FILE)) else None
    names = [file_name] if one else [s for s, _ in schema.shards] if schema else _recordio_files(directory)
    shards, readers, corrupt = [], {}, []
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            shards.append({"name": name, "records": None, "bytes": None})
            continue
        try:
            readers[name] = reader = RecordIOReader(path)
        except CorruptRecordIOError as exc:  # its chunk headers do not add up: it cannot even be counted
            if one and exc.offset == 0:  # the one file asked about is no RecordIO at all: nothing to show
                raise
            corrupt.append(_bad(name, exc))
            shards.append({"name": name, "records": None, "bytes": os.path.getsize(path)})
            continue
        shards.append({"name": name, "records": reader.num_records, "bytes": os.path.getsize(path)})
    if verify:
        corrupt += _verify(readers, on_start, on_progress)
    total = sum(s["records"] or 0 for s in shards)
    disagreements = _disagreements(schema, shards, total) if schema and not one else []
    decoded_as, rows = _decode_head(_head(readers, head, corrupt), schema)
    corrupt.sort(key=lambda c: (names.index(c["name"]), c["offset"]))  # in shard order, as listed
    return {"directory": directory, "schema": schema.to_json() if schema else None, "records": total,
            "shards": shards, "agrees": (not disagreements) if schema and not one else None,
            "disagreements": disagreements, "verified": verify, "corrupt": corrupt,
            "decoded_as": decoded_as, "head": rows}


def _bad(name: str, exc: CorruptRecordIOError) -> dict:
    return {"name": name, "offset": exc.offset, "reason": exc.reason}


def _verify(readers: dict[str, RecordIOReader], on_start, on_progress) -> list[dict]:
    sizes = {name: os.path.getsize(reader.path) for name, reader in readers.items()}
    if on_start:
        on_start(sum(sizes.values()))
    corrupt = []
    for name, reader in readers.items():
        for chunk, exc in reader.verify():
            if exc is not None:
                corrupt.append(_bad(name, exc))
            if on_progress:
                on_progress(_CHUNK_HEADER + chunk.compressed_size)
    return corrupt


def _head(readers: dict[str, RecordIOReader], head: int, corrupt: list[dict]) -> list[bytes]:
    """The first ``head`` records of the shards without damaged chunks; a damage met here (``verify`` off)
    joins ``corrupt`` and that shard is passed over."""
    bad = {c["name"] for c in corrupt}
    records: list[bytes] = []
    for name, reader in readers.items():
        if len(records) >= head:
            break
        if name in bad:
            continue
        try:
            records += reader.records(0, min(reader.num_records, head - len(records)))
        except CorruptRecordIOError as exc:
            corrupt.append(_bad(name, exc))
    return records


def _recordio_files(directory: str) -> list[str]:
    found = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(".") or os.path.isdir(path):
            continue
        try:
            if sniff(path) == RECORDIO:
                found.append(name)
        except NotDataError:
            pass
    if not found:
        raise DataError(f"{directory} holds no RecordIO files and no {SCHEMA_FILE}")
    return found


def _disagreements(schema: Schema, shards: list[dict], total: int) -> list[str]:
    out = [f"{s['name']} is missing" for s in shards if s["bytes"] is None]
    expected = dict(schema.shards)
    out += [f"{s['name']} holds {s['records']} records, {SCHEMA_FILE} says {expected[s['name']]}"
            for s in shards if s["records"] is not None and s["records"] != expected[s["name"]]]
    uncounted = any(s["records"] is None and s["bytes"] is not None for s in shards)  # reported as corrupt
    if total != schema.records and not uncounted:
        out.append(f"the shards hold {total} records, {SCHEMA_FILE} says {schema.records}")
    return out


def _decode_head(records: list[bytes], schema: Schema | None) -> tuple[str, list[dict]]:
    if schema is not None:
        columns = decode_rows(records, schema)
        return "schema", [{f.name: readable(columns[f.name][i]) for f in schema.fields} for i in range(len(records))]
    from flextrain.data.example import decode_example

    try:
        examples = [decode_example(r) for r in records]
    except DataError:
        examples = None
    if examples and all(examples):  # an empty Example parses from almost any bytes: not evidence
        return "example", [{k: readable(v) for k, v in sorted(e.items())} for e in examples]
    return "raw", [{"bytes": len(r), "first_bytes": r[:_SHOWN_BYTES].hex(" ")} for r in records]


def readable(value):
    """A JSON-able view of one decoded value: numbers, lists (long ones cut, with their shape), text."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": len(value), "first_bytes": bytes(value[:_SHOWN_BYTES]).hex(" ")}
    if isinstance(value, list):  # bytes features of an Example
        return [readable(v) for v in value]
    arr = np.asarray(value)
    if arr.ndim == 0:
        return arr.item()
    flat = arr.reshape(-1)
    if flat.size <= _SHOWN_VALUES and arr.ndim == 1:
        return flat.tolist()
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "first": flat[:_SHOWN_VALUES].tolist()}
