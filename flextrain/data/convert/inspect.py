"""``flextrain data inspect``: what a directory of RecordIO shards holds.

:func:`inspect_dir` counts the records of every RecordIO file in the
directory with the reader, compares the counts with ``schema.json`` when
there is one, and decodes the first records: with the schema
(:func:`flextrain.data.rows.decode_rows`), or without one as
``tf.train.Example`` if they parse as such, else as raw bytes (size and
first bytes). The result is plain JSON-able data.
"""

from __future__ import annotations

import os

import numpy as np

from flextrain.data.errors import DataError
from flextrain.data.formats import RECORDIO, NotDataError, sniff
from flextrain.data.recordio import RecordIOReader
from flextrain.data.rows import SCHEMA_FILE, Schema, decode_rows, load_schema

__all__ = ["inspect_dir", "readable"]

_SHOWN_VALUES = 8  # values of an array shown per field
_SHOWN_BYTES = 16


def inspect_dir(directory: str | os.PathLike[str], *, head: int = 3) -> dict:
    """Schema, counts and the first ``head`` records of a converted directory (or any RecordIO files; or
    one RecordIO file, decoded with its directory's schema.json if there is one: no count is checked then).

    Returns ``{"directory", "schema" (None without schema.json), "records" (counted), "shards":
    [{"name", "records", "bytes"}], "agrees" (counts match the schema's; None without one),
    "disagreements" (what differs), "decoded_as" ("schema", "example" or "raw"), "head": [records]}``.
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
    shards, readers = [], []
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            shards.append({"name": name, "records": None, "bytes": None})
            continue
        reader = RecordIOReader(path)
        readers.append(reader)
        shards.append({"name": name, "records": reader.num_records, "bytes": os.path.getsize(path)})
    total = sum(s["records"] or 0 for s in shards)
    disagreements = _disagreements(schema, shards, total) if schema and not one else []
    records = []
    for reader in readers:
        if len(records) >= head:
            break
        records += reader.records(0, min(reader.num_records, head - len(records)))
    decoded_as, rows = _decode_head(records, schema)
    return {"directory": directory, "schema": schema.to_json() if schema else None, "records": total,
            "shards": shards, "agrees": (not disagreements) if schema and not one else None,
            "disagreements": disagreements,
            "decoded_as": decoded_as, "head": rows}


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
    out = [f"{s['name']} is missing" for s in shards if s["records"] is None]
    expected = dict(schema.shards)
    out += [f"{s['name']} holds {s['records']} records, {SCHEMA_FILE} says {expected[s['name']]}"
            for s in shards if s["records"] is not None and s["records"] != expected[s["name"]]]
    if total != schema.records:
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
