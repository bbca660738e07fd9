"""Rows of named fields as RecordIO records: the schema and the encoding ``flextrain data convert`` writes.

A :class:`Schema` lists the fields of every record (name, dtype, shape) and,
as written to ``DIR/schema.json`` next to the shards, how the records are
stored (``format``), how many there are and where they came from.

RECORD ENCODING (``format: "recordio"``, a contract: models decode it with
:func:`decode_rows`): the fields in schema order, back to back, no header.

* A *fixed* field (a numeric dtype and a shape with no ``-1``) is its values,
  row-major, little-endian, ``prod(shape) * itemsize`` bytes (``[]``: one value).
* A *variable* field (a shape holding ``-1``, or dtype ``string``/``bytes``)
  is a uint32-LE byte count followed by that many bytes: the values
  (little-endian; the ``-1`` dimension is what the byte count implies) or
  the UTF-8 text or the bytes themselves.

Dtypes: ``bool`` (1 byte, 0/1), ``int8`` .. ``int64``, ``uint8`` .. ``uint64``,
``float16``, ``float32``, ``float64``, ``string``, ``bytes``. ``string`` and
``bytes`` fields are scalars (shape ``[]``).

``format: "example"`` records are serialized ``tf.train.Example`` (see
:mod:`flextrain.data.example`), one feature per field, values flattened; the
schema restores their dtype and shape. :func:`decode_rows` reads both.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field as dc_field

import numpy as np

from flextrain.data.errors import DataError

__all__ = ["SCHEMA_FILE", "DTYPES", "Field", "Schema", "encode_rows", "decode_rows", "load_schema", "save_schema"]

#: The schema's file name in a converted directory (data paths pass over it).
SCHEMA_FILE = "schema.json"
NUMERIC_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "float16", "float32", "float64")
DTYPES = (*NUMERIC_DTYPES, "string", "bytes")
FORMATS = ("recordio", "example")
_LEN = struct.Struct("<I")


@dataclass(frozen=True)
class Field:
    """One named field of every record: ``dtype`` (one of DTYPES) and ``shape`` (``()`` a scalar, ``-1``
    marks the one dimension whose length varies from record to record)."""

    name: str
    dtype: str
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in DTYPES:
            raise ValueError(f"field {self.name!r}: unknown dtype {self.dtype!r} (one of {', '.join(DTYPES)})")
        if self.dtype in ("string", "bytes") and self.shape:
            raise ValueError(f"field {self.name!r}: {self.dtype} fields are scalars, got shape {list(self.shape)}")
        if sum(d == -1 for d in self.shape) > 1 or any(d < -1 for d in self.shape):
            raise ValueError(f"field {self.name!r}: bad shape {list(self.shape)} (sizes >= 0, at most one -1)")

    @property
    def fixed(self) -> bool:
        """Stored without a length prefix: numeric with every dimension known."""
        return self.dtype in NUMERIC_DTYPES and -1 not in self.shape

    @property
    def np_dtype(self) -> np.dtype:
        """The little-endian numpy dtype of a numeric field."""
        return np.dtype(self.dtype).newbyteorder("<")

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Schema:
    """The fields of every record and, once written, how and where they are stored.

    ``records`` and ``shards`` (``(name, records)`` pairs in order) count what
    was written; ``source``/``source_kind`` say what was converted;
    ``class_names`` are an image folder's classes (label ``i`` is ``class_names[i]``).
    """

    fields: tuple[Field, ...]
    format: str = "recordio"
    records: int = 0
    shards: tuple[tuple[str, int], ...] = ()
    source: str = ""
    source_kind: str = ""
    class_names: tuple[str, ...] | None = None
    notes: tuple[str, ...] = dc_field(default=())

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown record format {self.format!r} (one of {', '.join(FORMATS)})")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"field names repeat: {names}")

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def to_json(self) -> dict:
        out = {"version": 1, "format": self.format, "fields": [f.to_json() for f in self.fields],
               "records": self.records, "shards": [{"name": n, "records": c} for n, c in self.shards],
               "source": self.source, "source_kind": self.source_kind}
        if self.class_names is not None:
            out["class_names"] = list(self.class_names)
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> Schema:
        return cls(fields=tuple(Field(f["name"], f["dtype"], tuple(f.get("shape", ()))) for f in data["fields"]),
                   format=data.get("format", "recordio"), records=int(data.get("records", 0)),
                   shards=tuple((s["name"], int(s["records"])) for s in data.get("shards", ())),
                   source=data.get("source", ""), source_kind=data.get("source_kind", ""),
                   class_names=tuple(data["class_names"]) if data.get("class_names") is not None else None,
                   notes=tuple(data.get("notes", ())))


def save_schema(directory: str | os.PathLike[str], schema: Schema) -> str:
    """Write ``directory/schema.json`` atomically (a temporary file renamed); returns its path."""
    path = os.path.join(os.fspath(directory), SCHEMA_FILE)
    tmp = os.path.join(os.fspath(directory), f".{SCHEMA_FILE}.tmp")
    with open(tmp, "w") as f:
        json.dump(schema.to_json(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def load_schema(directory: str | os.PathLike[str]) -> Schema:
    """The schema of a converted directory (or the schema file itself); DataError if missing or invalid."""
    path = os.fspath(directory)
    if os.path.isdir(path):
        path = os.path.join(path, SCHEMA_FILE)
    try:
        with open(path) as f:
            return Schema.from_json(json.load(f))
    except FileNotFoundError:
        raise DataError(f"no schema: {path} does not exist (written by `flextrain data convert`)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path} is not a valid schema: {exc}") from None


# ---- encoding -----------------------------------------------------------------------
def _fixed_dtype(fields: Sequence[Field]) -> np.dtype:
    """A packed structured dtype with one (sub-array) member per fixed field."""
    return np.dtype([(f.name, f.np_dtype, f.shape) for f in fields])


def encode_rows(columns: Mapping[str, object], schema: Schema) -> list[bytes]:
    """Raw records (``format: "recordio"``) of rows given as columns: name -> array of shape
    ``(n, *shape)`` for fixed fields, a sequence of n arrays / str / bytes for variable ones.

    Values are cast to the field's dtype (a float given to an int field is refused)."""
    fields = schema.fields
    n = _row_count(columns, fields)
    fixed = [f for f in fields if f.fixed]
    if len(fixed) == len(fields):  # one packed buffer cut into equal records
        packed = np.empty(n, dtype=_fixed_dtype(fields))
        for f in fields:
            packed[f.name] = _cast(columns[f.name], f, (n, *f.shape))
        size = packed.dtype.itemsize
        buf = packed.tobytes()
        return [buf[i * size:(i + 1) * size] for i in range(n)]
    parts = []  # per field, n byte strings
    for f in fields:
        col = columns[f.name]
        if f.fixed:
            arr = _cast(col, f, (n, *f.shape))
            size = arr.itemsize * math.prod(f.shape)
            buf = arr.tobytes()
            parts.append([buf[i * size:(i + 1) * size] for i in range(n)])
        elif f.dtype == "string":
            parts.append([_prefixed(str(v).encode("utf-8")) for v in col])
        elif f.dtype == "bytes":
            parts.append([_prefixed(bytes(v)) for v in col])
        else:
            parts.append([_prefixed(_cast(v, f, None).tobytes()) for v in col])
    return [b"".join(row) for row in zip(*parts)]


def _prefixed(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


def _row_count(columns: Mapping[str, object], fields: Sequence[Field]) -> int:
    counts = {f.name: len(columns[f.name]) for f in fields}
    if len(set(counts.values())) > 1:
        raise ValueError(f"columns have different lengths: {counts}")
    return next(iter(counts.values()), 0)


def _cast(values, f: Field, shape: tuple[int, ...] | None) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind == "f" and f.dtype not in ("float16", "float32", "float64"):
        raise ValueError(f"field {f.name!r}: {arr.dtype} values for a {f.dtype} field")
    arr = arr.astype(f.np_dtype, copy=False)
    if shape is not None:
        arr = arr.reshape(shape)
    elif f.shape and -1 in f.shape:
        known = math.prod(d for d in f.shape if d != -1)
        if known and arr.size % known:
            raise ValueError(f"field {f.name!r}: {arr.size} values do not fit shape {list(f.shape)}")
    return np.ascontiguousarray(arr)


# ---- decoding -----------------------------------------------------------------------
def decode_rows(records: Sequence[bytes], schema: Schema, *, source: str | None = None) -> dict[str, object]:
    """Decode records written by ``flextrain data convert`` (either format) into columns.

    Fixed fields become one array of shape ``(len(records), *shape)`` with the field's dtype;
    variable-shape fields a list of arrays; ``string`` fields a list of str; ``bytes`` fields a
    list of bytes. Raises DataError naming the record (and ``source``) that does not match the schema.
    """
    if schema.format == "example":
        return _decode_examples(records, schema, source=source)
    where = f" of {source}" if source else ""
    fields = schema.fields
    if all(f.fixed for f in fields):
        dtype = _fixed_dtype(fields)
        bad = next((i for i, r in enumerate(records) if len(r) != dtype.itemsize), None)
        if bad is not None:
            raise DataError(f"record {bad}{where} has {len(records[bad])} bytes, the schema's fields "
                            f"({', '.join(f.name for f in fields)}) take {dtype.itemsize}")
        packed = np.frombuffer(b"".join(records), dtype=dtype)
        return {f.name: packed[f.name].copy().reshape(len(records), *f.shape) for f in fields}
    out: dict[str, list] = {f.name: [] for f in fields}
    for i, record in enumerate(records):
        view, pos = memoryview(record), 0
        for f in fields:
            try:
                if f.fixed:
                    size = f.np_dtype.itemsize * math.prod(f.shape)
                    piece = view[pos:pos + size]
                else:
                    (size,) = _LEN.unpack_from(view, pos)
                    pos += _LEN.size
                    piece = view[pos:pos + size]
                if len(piece) != size:
                    raise ValueError("it ends early")
                out[f.name].append(_value(bytes(piece), f))
            except (ValueError, struct.error) as exc:
                raise DataError(f"record {i}{where}: field {f.name!r} at byte {pos} does not match the schema "
                                f"({exc})") from None
            pos += size
        if pos != len(record):
            raise DataError(f"record {i}{where} has {len(record) - pos} bytes past its last field")
    return _columns(out, fields)


def _columns(out: Mapping[str, list], fields: Sequence[Field]) -> dict[str, object]:
    """Fixed fields stacked into one array each (an empty one for no records); the others as lists."""
    return {f.name: (np.stack(out[f.name]) if out[f.name] else np.empty((0, *f.shape), f.np_dtype))
            if f.fixed else out[f.name] for f in fields}


def _value(piece: bytes, f: Field):
    if f.dtype == "string":
        return piece.decode("utf-8")
    if f.dtype == "bytes":
        return piece
    arr = np.frombuffer(piece, dtype=f.np_dtype)
    known = math.prod(d for d in f.shape if d != -1)
    shape = tuple(d if d != -1 else (arr.size // known if known else 0) for d in f.shape)
    return arr.reshape(shape).astype(f.np_dtype.newbyteorder("="))


def _decode_examples(records: Sequence[bytes], schema: Schema, *, source: str | None) -> dict[str, object]:
    from flextrain.data.example import decode_example

    where = f" of {source}" if source else ""
    out: dict[str, list] = {f.name: [] for f in schema.fields}
    for i, record in enumerate(records):
        example = decode_example(record, where=f"record {i}{where}")
        for f in schema.fields:
            if f.name not in example:
                raise DataError(f"record {i}{where} has no feature {f.name!r}")
            value = example[f.name]
            if f.dtype in ("string", "bytes"):
                if len(value) != 1:
                    raise DataError(f"record {i}{where}: feature {f.name!r} holds {len(value)} values, expected 1")
                out[f.name].append(value[0].decode("utf-8") if f.dtype == "string" else value[0])
                continue
            arr = np.asarray(value).astype(np.dtype(f.dtype))
            known = math.prod(d for d in f.shape if d != -1)
            if -1 in f.shape:
                shape = tuple(d if d != -1 else (arr.size // known if known else 0) for d in f.shape)
            else:
                shape = f.shape
            if math.prod(shape) != arr.size:
                raise DataError(f"record {i}{where}: feature {f.name!r} holds {arr.size} values, "
                                f"shape {list(f.shape)} needs {math.prod(shape)}")
            out[f.name].append(arr.reshape(shape))
    return _columns(out, schema.fields)
