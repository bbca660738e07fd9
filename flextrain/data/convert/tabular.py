"""Tabular sources of ``flextrain data convert``: CSV, JSON lines, NumPy ``.npy``/``.npz``, Parquet.

Each is parsed and checked whole when opened (``flextrain data convert`` parses a CSV
file without quotes in its workers instead: :mod:`~flextrain.data.convert.csvsplit`); the dtypes are inferred from
every value, never narrowed (a float16 array stays float16, a CSV column of
integers is int64, of other numbers float64, else string).
"""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np

from flextrain.data.convert.base import Source
from flextrain.data.errors import DataError
from flextrain.data.rows import DTYPES, Field

__all__ = ["is_number", "open_csv", "open_jsonl", "open_npy", "open_npz", "open_parquet"]


# ---- CSV --------------------------------------------------------------------------------
def open_csv(path: str, *, header: bool | None = None) -> Source:
    """Columns named by the header (else c0, c1, ...), each int64, float64 or string."""
    rows, width, first = [], 0, 0
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # an Excel export's byte order mark is no data
            reader = csv.reader(f)
            ended = 0  # the line the previous row ended on
            for row in reader:
                began, ended = ended + 1, reader.line_num
                if not row:
                    continue  # a blank line
                if len(row) != width:
                    if rows and ended > began and any("\n" in v or "\r" in v for v in row):
                        raise DataError(f"{path}, line {began}: a quoted field runs from there to line {ended}, "
                                        f"leaving {len(row)} field(s) where line {first} has {width} (a quote "
                                        "not closed?)")
                    if rows:
                        raise DataError(f"{path}, line {ended}: {len(row)} field(s), but line {first} "
                                        f"has {width} (a ragged CSV line)")
                    width, first = len(row), ended
                rows.append(row)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise DataError(f"{path}: not CSV ({exc})") from None
    if header is None:
        header = bool(rows) and not any(map(is_number, rows[0])) and (len(rows) == 1 or any(map(is_number, rows[1])))
    names = [c.strip() or f"c{i}" for i, c in enumerate(rows[0])] if header and rows else \
        [f"c{i}" for i in range(len(rows[0]) if rows else 0)]
    if len(set(names)) != len(names):
        raise DataError(f"{path}: the header names a column twice: {names}")
    data = rows[1:] if header else rows
    if not data:
        raise DataError(f"{path} holds no records")
    columns, fields = {}, []
    for i, (name, values) in enumerate(zip(names, zip(*data))):
        col = _parse_column(values)
        dtype = "string" if isinstance(col, list) else str(col.dtype)
        fields.append(Field(name, dtype))
        columns[name] = col
    return Source("csv", path, tuple(fields), len(data), columns=columns)


def is_number(text: str) -> bool:
    """Whether ``float`` takes ``text``."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse_column(values: tuple[str, ...]):
    """int64 if every value is an integer, else float64 if every value is a number, else the strings."""
    for parse, dtype in ((int, np.int64), (float, np.float64)):
        try:  # a column of the other kind fails at its first such value
            return np.fromiter(map(parse, values), dtype, len(values))
        except (ValueError, OverflowError):
            pass
    return list(values)


# ---- JSON lines -------------------------------------------------------------------------
def open_jsonl(path: str) -> Source:
    """One record per line, a JSON object; fields from the first object's keys, dtypes from every value."""
    records, lines = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}, line {lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}, line {lineno}: a JSON object expected, got {type(obj).__name__}")
            if records and obj.keys() != records[0].keys():
                missing = sorted(records[0].keys() - obj.keys())
                extra = sorted(obj.keys() - records[0].keys())
                raise DataError(f"{path}, line {lineno}: keys differ from line {lines[0]}'s"
                                f"{f' (missing {missing})' if missing else ''}{f' (extra {extra})' if extra else ''}")
            records.append(obj)
            lines.append(lineno)
    if not records:
        raise DataError(f"{path} holds no records")
    columns, fields = {}, []
    for name in records[0]:
        f, col = _json_column(path, name, [r[name] for r in records], lines)
        fields.append(f)
        columns[name] = col
    return Source("jsonl", path, tuple(fields), len(records), columns=columns)


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "null" if value is None else type(value).__name__


def _json_column(path: str, name: str, values: list, lines: list[int]) -> tuple[Field, object]:
    kinds = [_json_kind(v) for v in values]
    kind_set = set(kinds)
    if kind_set <= {"int", "float"} or kind_set == {"bool"}:
        dtype = "bool" if kind_set == {"bool"} else "int64" if kind_set == {"int"} else "float64"
        try:
            return Field(name, dtype), np.array(values, dtype=dtype)
        except OverflowError:
            raise DataError(f"{path}: field {name!r} holds an integer outside the int64 range") from None
    if kind_set == {"string"}:
        return Field(name, "string"), values
    if kind_set == {"list"}:
        return _json_lists(path, name, values, lines)
    first = kinds[0]
    bad = next(i for i, k in enumerate(kinds) if k != first or k not in ("int", "float", "bool", "string", "list"))
    raise DataError(f"{path}, line {lines[bad]}: field {name!r} holds {kinds[bad]} but line {lines[0]} holds {first} "
                    "(one kind per field: numbers, booleans, strings or lists of numbers)")


def _json_lists(path: str, name: str, values: list, lines: list[int]) -> tuple[Field, object]:
    arrays = []
    for i, v in enumerate(values):
        try:
            arr = np.array(v)
        except ValueError:
            raise DataError(f"{path}, line {lines[i]}: field {name!r} is a ragged nested list") from None
        if arr.size and arr.dtype.kind not in "biuf":
            raise DataError(f"{path}, line {lines[i]}: field {name!r} holds a list of {arr.dtype.kind!r} values, "
                            "not numbers")
        arrays.append(arr)
    nonempty = [a for a in arrays if a.size]
    kinds = {a.dtype.kind for a in nonempty}
    dtype = "bool" if kinds == {"b"} else "float64" if "f" in kinds else "int64"
    shapes = {a.shape for a in arrays}
    if len(shapes) == 1:
        shape = arrays[0].shape
        return Field(name, dtype, shape), np.stack(arrays).astype(dtype)
    ndims = {a.ndim for a in nonempty} or {1}
    inner = {a.shape[1:] for a in nonempty}
    if len(ndims) > 1 or len(inner) > 1:
        raise DataError(f"{path}: field {name!r} has lists of shapes {sorted(shapes)[:4]} that differ in more than "
                        "their first dimension")
    shape = (-1, *next(iter(inner), ()))
    known = math.prod(shape[1:])
    return Field(name, dtype, shape), [a.astype(dtype).reshape(-1, *shape[1:]) if known else a.astype(dtype)
                                       for a in arrays]


# ---- NumPy ------------------------------------------------------------------------------
def _array_field(path: str, name: str, arr: np.ndarray) -> Field:
    if arr.ndim == 0:
        raise DataError(f"{path}: array {name!r} is a scalar; its first dimension must count the records")
    kind = arr.dtype.kind
    if kind == "U":
        dtype = "string"
    elif kind == "S":
        dtype = "bytes"
    elif arr.dtype.name in DTYPES:
        dtype = arr.dtype.name
    else:
        what, advice = _why_not(arr.dtype)
        raise DataError(f"{path}: array {name!r} has dtype {arr.dtype}{what}, which flextrain records do not "
                        f"hold (one of {', '.join(DTYPES[:-2])}, or str/bytes){advice}")
    if dtype in ("string", "bytes") and arr.ndim != 1:
        raise DataError(f"{path}: array {name!r} of {dtype} must be one-dimensional, got shape {arr.shape}")
    return Field(name, dtype, arr.shape[1:])


def _why_not(dtype: np.dtype) -> tuple[str, str]:
    """``(what an unsupported dtype probably is, what to do)``. The .npy format has no name for ml_dtypes'
    types: a bfloat16 array is saved as a 2-byte void ('<V2') and loads as ``|V2`` with or without ml_dtypes."""
    to_float32 = "convert it to float32 first: np.save(path, {}.astype(np.float32))"
    if dtype.name == "bfloat16":
        return "", ": bfloat16 is not supported; " + to_float32.format("array")
    if dtype.kind != "V":
        return "", ""
    if dtype.names is not None:
        return (f" (a structured array, fields {', '.join(dtype.names)})",
                ": save each field as its own array of an .npz")
    if dtype.itemsize == 2:
        return (" (a 2-byte void dtype: probably bfloat16 saved with ml_dtypes, which .npy files cannot name)",
                ": bfloat16 .npy (ml_dtypes) is not supported; "
                + to_float32.format("array.view(ml_dtypes.bfloat16)"))
    if dtype.itemsize == 1:
        return (" (a 1-byte void dtype: probably a float8 or int4 type saved with ml_dtypes)",
                ": such types are not supported; convert the array to float32 first")
    return f" (a {dtype.itemsize}-byte void dtype: raw bytes)", ""


def _array_column(arr: np.ndarray, f: Field):
    if f.dtype == "string":
        return [str(v) for v in arr]
    if f.dtype == "bytes":
        return [bytes(v) for v in arr]
    return arr


def _load_numpy(path: str):
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise DataError(f"{path} cannot be loaded without pickle (object arrays are not supported): {exc}") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{path} is not a NumPy file: {exc}") from None


def open_npy(path: str, *, field: str = "x") -> Source:
    """One field (``field``, default ``x``): the array's rows, its first dimension the records."""
    arr = _load_numpy(path)
    if not isinstance(arr, np.ndarray):
        raise DataError(f"{path} holds several arrays (an .npz archive): name it *.npz")
    f = _array_field(path, field, arr)
    return Source("npy", path, (f,), len(arr), columns={field: _array_column(arr, f)})


def open_npz(path: str) -> Source:
    """One field per array, in the archive's order; every array's first dimension counts the records."""
    archive = _load_numpy(path)
    if isinstance(archive, np.ndarray):
        raise DataError(f"{path} holds one array (an .npy file): name it *.npy")
    with archive:
        arrays = {name: archive[name] for name in archive.files}
    if not arrays:
        raise DataError(f"{path} holds no arrays")
    fields = tuple(_array_field(path, name, arr) for name, arr in arrays.items())
    lengths = {name: len(arr) for name, arr in arrays.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{n}={k}" for n, k in lengths.items())
        raise DataError(f"{path}: arrays have different lengths (first dimension): {listed}")
    columns = {f.name: _array_column(arrays[f.name], f) for f in fields}
    return Source("npz", path, fields, next(iter(lengths.values())), columns=columns)


# ---- Parquet ----------------------------------------------------------------------------
def open_parquet(path: str) -> Source:
    """A Parquet file or a directory of them (read in name order, one schema); dtypes from the Arrow types:
    fixed-size lists give shapes, lists a variable first dimension."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if not n.startswith(".")] \
        if os.path.isdir(path) else [path]
    tables = []
    for file in files:
        try:
            tables.append(pq.read_table(file))
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{file} is not a readable Parquet file: {exc}") from None
    for file, table in zip(files[1:], tables[1:]):
        if not table.schema.equals(tables[0].schema):
            raise DataError(f"{file}: its Parquet schema differs from {files[0]}'s:\n{table.schema}\nvs\n"
                            f"{tables[0].schema}")
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if not table.num_rows:
        raise DataError(f"{path} holds no records")
    fields, columns = [], {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if col.null_count:
            row = next(i for i, v in enumerate(col.is_null().to_pylist()) if v)
            raise DataError(f"{path}: column {name!r} is null at row {row} (records cannot hold nulls)")
        f, values = _arrow_column(pa, path, name, col)
        fields.append(f)
        columns[name] = values
    return Source("parquet", path, tuple(fields), table.num_rows, columns=columns)


def _arrow_dtype(pa, path: str, name: str, t) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    try:
        dtype = np.dtype(t.to_pandas_dtype()).name
    except (NotImplementedError, TypeError):
        dtype = ""
    if dtype not in DTYPES:
        raise DataError(f"{path}: column {name!r} has Arrow type {t}, which flextrain records do not hold")
    return dtype


def _arrow_column(pa, path: str, name: str, col) -> tuple[Field, object]:
    t, shape, variable = col.type, [], False
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        variable, t = True, t.value_type
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    dtype = _arrow_dtype(pa, path, name, t)
    if (variable or shape) and dtype in ("string", "bytes"):
        raise DataError(f"{path}: column {name!r} holds lists of {dtype}; only lists of numbers are supported")
    if dtype in ("string", "bytes"):
        return Field(name, dtype), col.to_pylist()
    if not variable:
        flat = col
        for _ in shape:
            flat = flat.flatten()
        return Field(name, dtype, shape), flat.to_numpy(zero_copy_only=False).reshape(len(col), *shape)
    offsets = col.offsets.to_numpy()
    offsets = offsets - offsets[0]
    flat = col.flatten()
    for _ in shape:
        flat = flat.flatten()
    values = flat.to_numpy(zero_copy_only=False).reshape(-1, *shape)
    return Field(name, dtype, (-1, *shape)), [values[offsets[i]:offsets[i + 1]] for i in range(len(col))]
