"""Serialized ``tf.train.Example`` records, written and read without TensorFlow.

ElasticDL jobs store one ``tf.train.Example`` per RecordIO record; model-zoo
modules parse them with ``tf.io.parse_single_example`` /
``tf.io.parse_example``. The protobuf wire format of Example is small, so
flextrain encodes and decodes it here in pure Python (TensorFlow stays an
optional extra; data preparation and PyTorch modules do not need it):

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      map entry: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed]; }
    Int64List { repeated int64 value = 1 [packed]; }

``encode_example`` writes what TensorFlow writes (packed lists, keys in
sorted order); ``decode_example`` accepts packed and unpacked lists alike.

``write_digits_examples`` writes the digits demo set as Examples with features
``image`` (64 floats, pixel values 0..16, row-major 8x8) and ``label`` (one
int64, 0..9): ``flextrain data digits --format example``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping

import numpy as np

from flextrain.data.errors import DataError
from flextrain.data.recordio import Compressor, write_records

__all__ = ["encode_example", "decode_example", "check_features", "write_digits_examples", "DIGITS_EXAMPLE_FEATURES"]

# feature name -> (kind, length) of the digits Examples
DIGITS_EXAMPLE_FEATURES = {"image": ("float", 64), "label": ("int64", 1)}

_LEN, _VARINT, _I32, _I64 = 2, 0, 5, 1
_BYTES, _FLOAT, _INT64 = 1, 2, 3
_KIND_NAMES = {_BYTES: "bytes", _FLOAT: "float", _INT64: "int64"}
_INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


# ---- encoding ---------------------------------------------------------------------
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: ten-byte two's complement, as protobuf does
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(payload)) + payload


def _feature(name: str, value) -> bytes:
    """One Feature message for ``value``: bytes/str (or a list of them), floats or ints."""
    if isinstance(value, (bytes, str)):
        value = [value]
    if isinstance(value, np.ndarray):
        arr = value.reshape(-1)
        if arr.dtype.kind in "iub":
            value = arr.astype(np.int64).tolist()
        elif arr.dtype.kind == "f":
            return _field(_FLOAT, _field(1, arr.astype("<f4").tobytes()))
        else:
            value = arr.tolist()
    items = list(value)
    if not items:
        raise ValueError(f"feature {name!r} is empty; its kind (bytes, float, int64) cannot be told")
    if all(isinstance(v, (bytes, str)) for v in items):
        body = b"".join(_field(1, v.encode() if isinstance(v, str) else v) for v in items)
        return _field(_BYTES, body)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        lo, hi = _INT64_RANGE
        bad = next((v for v in items if not lo <= int(v) <= hi), None)
        if bad is not None:
            raise ValueError(f"feature {name!r}: {bad} is outside the int64 range")
        return _field(_INT64, _field(1, b"".join(_varint(int(v)) for v in items)))
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in items):
        return _field(_FLOAT, _field(1, np.asarray(items, dtype="<f4").tobytes()))
    kinds = sorted({type(v).__name__ for v in items})
    raise ValueError(f"feature {name!r} mixes or holds unsupported values ({', '.join(kinds)}); "
                     "use bytes/str, floats or ints")


def encode_example(features: Mapping[str, object]) -> bytes:
    """A serialized ``tf.train.Example`` holding ``features`` (name -> bytes/str, floats or ints)."""
    entries = b"".join(_field(1, _field(1, name.encode()) + _field(2, _feature(name, value)))
                       for name, value in sorted(features.items()))
    return _field(1, entries)


# ---- decoding ---------------------------------------------------------------------
def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) for each field of a message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
        elif wire == _LEN:
            size, pos = _read_varint(buf, pos)
            value, pos = buf[pos: pos + size], pos + size
            if pos > len(buf):
                raise ValueError("truncated length-delimited field")
        elif wire in (_I32, _I64):
            size = 4 if wire == _I32 else 8
            value, pos = buf[pos: pos + size], pos + size
            if pos > len(buf):
                raise ValueError("truncated fixed-size field")
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _decode_list(kind: int, body: bytes):
    values: list = []
    for number, wire, value in _fields(body):
        if number != 1:
            continue
        if kind == _BYTES and wire == _LEN:
            values.append(bytes(value))
        elif kind == _FLOAT and wire == _LEN:  # packed
            if len(value) % 4:
                raise ValueError("packed float list is not a whole number of floats")
            values.extend(np.frombuffer(value, dtype="<f4").tolist())
        elif kind == _FLOAT and wire == _I32:
            values.append(struct.unpack("<f", value)[0])
        elif kind == _INT64 and wire == _LEN:  # packed
            pos = 0
            while pos < len(value):
                v, pos = _read_varint(value, pos)
                values.append(_signed(v))
        elif kind == _INT64 and wire == _VARINT:
            values.append(_signed(value))
        else:
            raise ValueError(f"a {_KIND_NAMES[kind]} list holds a field of wire type {wire}")
    if kind == _FLOAT:
        return np.asarray(values, dtype=np.float32)
    if kind == _INT64:
        return np.asarray(values, dtype=np.int64)
    return values


def decode_example(record: bytes, *, where: str = "record") -> dict[str, object]:
    """Features of a serialized Example: name -> float32 array, int64 array, or list of bytes.

    Raises DataError naming ``where`` when ``record`` is not an Example.
    """
    out: dict[str, object] = {}
    try:
        for number, wire, features in _fields(record):
            if number != 1 or wire != _LEN:
                continue
            for fnum, fwire, entry in _fields(features):
                if fnum != 1 or fwire != _LEN:
                    continue
                name, kind, body = "", None, b""
                for enum, ewire, value in _fields(entry):
                    if enum == 1 and ewire == _LEN:
                        name = bytes(value).decode()
                    elif enum == 2 and ewire == _LEN:
                        for knum, kwire, kvalue in _fields(value):
                            if knum in _KIND_NAMES and kwire == _LEN:
                                kind, body = knum, kvalue
                out[name] = _decode_list(kind, body) if kind else []
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{where} is not a serialized tf.train.Example: {exc}") from exc
    return out


# ---- the digits demo set as Examples ------------------------------------------------
def write_digits_examples(out_dir: str | os.PathLike[str], *, validation_fraction: float = 0.2,
                          seed: int = 0, max_chunk_size: int = 64 * 1024) -> dict:
    """``flextrain.data.digits.write_digits`` with each record a tf.train.Example (``image``, ``label``).

    Same split, order and files (``out_dir/{train,validation}/digits-00000.rio``).
    """
    from flextrain.data.digits import decode_digits, write_digits
    from flextrain.data.recordio import read_records

    info = write_digits(out_dir, validation_fraction=validation_fraction, seed=seed,
                        max_chunk_size=max_chunk_size)
    for split in ("train", "validation"):
        path = os.path.join(os.fspath(out_dir), split, "digits-00000.rio")
        pixels, labels = decode_digits(read_records(path), source=path)
        records = [encode_example({"image": np.rint(p * 16), "label": [int(y)]}) for p, y in zip(pixels, labels)]
        write_records(path, records, compressor=Compressor.SNAPPY, max_chunk_size=max_chunk_size)
    return {**info, "format": "example"}


def check_features(decoded: Mapping[str, object], expected: Mapping[str, tuple[str, int]], *,
                   where: str) -> None:
    """DataError unless ``decoded`` has each expected feature with its kind and length."""
    for name, (kind, length) in expected.items():
        value = decoded.get(name)
        got_kind = ("bytes" if isinstance(value, list) else
                    "float" if isinstance(value, np.ndarray) and value.dtype == np.float32 else
                    "int64" if isinstance(value, np.ndarray) else None)
        if value is None or got_kind != kind or len(value) != length:
            raise DataError(f"{where}: feature {name!r} should be {length} {kind} value(s), got "
                            f"{'nothing' if value is None else f'{len(value)} {got_kind}'}")
