"""Serialized ``tf.train.Example`` records, written and read without TensorFlow.

ElasticDL jobs store one ``tf.train.Example`` per RecordIO record; model-zoo
modules parse them with ``tf.io.parse_single_example`` /
``tf.io.parse_example``. ``proto/example.proto`` declares TensorFlow's
Example schema, so protobuf encodes and decodes them without TensorFlow
(an optional extra; data preparation and PyTorch modules do not need it).

``encode_example`` writes what TensorFlow writes (packed lists, keys in
sorted order); ``decode_example`` accepts packed and unpacked lists alike.

``write_digits_examples`` writes the digits demo set as Examples with features
``image`` (64 floats, pixel values 0..16, row-major 8x8) and ``label`` (one
int64, 0..9): ``flextrain data digits --format example``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from google.protobuf.message import DecodeError

from flextrain.data.errors import DataError
from flextrain.proto import example_pb2
from flextrain.data.recordio import Compressor, write_records

__all__ = ["encode_example", "decode_example", "check_features", "write_digits_examples", "DIGITS_EXAMPLE_FEATURES"]

# feature name -> (kind, length) of the digits Examples
DIGITS_EXAMPLE_FEATURES = {"image": ("float", 64), "label": ("int64", 1)}

_INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


# ---- encoding ---------------------------------------------------------------------
def _fill(feature: example_pb2.Feature, name: str, value) -> None:
    """Set ``feature`` from ``value``: bytes/str (or a list of them), floats or ints."""
    if isinstance(value, (bytes, str)):
        value = [value]
    if isinstance(value, np.ndarray):
        arr = value.reshape(-1)
        if arr.dtype.kind == "f":
            feature.float_list.value.extend(arr.astype(np.float32).tolist())
            return
        value = arr.astype(np.int64).tolist() if arr.dtype.kind in "iub" else arr.tolist()
    items = list(value)
    if not items:
        raise ValueError(f"feature {name!r} is empty; its kind (bytes, float, int64) cannot be told")
    if all(isinstance(v, (bytes, str)) for v in items):
        feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in items)
    elif all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        lo, hi = _INT64_RANGE
        bad = next((v for v in items if not lo <= int(v) <= hi), None)
        if bad is not None:
            raise ValueError(f"feature {name!r}: {bad} is outside the int64 range")
        feature.int64_list.value.extend(int(v) for v in items)
    elif all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in items):
        feature.float_list.value.extend(float(v) for v in items)
    else:
        kinds = sorted({type(v).__name__ for v in items})
        raise ValueError(f"feature {name!r} mixes or holds unsupported values ({', '.join(kinds)}); "
                         "use bytes/str, floats or ints")


def encode_example(features: Mapping[str, object]) -> bytes:
    """A serialized ``tf.train.Example`` holding ``features`` (name -> bytes/str, floats or ints)."""
    example = example_pb2.Example()
    for name, value in features.items():
        _fill(example.features.feature[name], name, value)
    return example.SerializeToString(deterministic=True)  # deterministic: map keys sorted


# ---- decoding ---------------------------------------------------------------------
def decode_example(record: bytes, *, where: str = "record") -> dict[str, object]:
    """Features of a serialized Example: name -> float32 array, int64 array, or list of bytes.

    Raises DataError naming ``where`` when ``record`` is not an Example.
    """
    example = example_pb2.Example()
    try:
        example.ParseFromString(record)
    except DecodeError as exc:
        raise DataError(f"{where} is not a serialized tf.train.Example: {exc}") from exc
    out: dict[str, object] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "float_list":
            out[name] = np.asarray(feature.float_list.value, dtype=np.float32)
        elif kind == "int64_list":
            out[name] = np.asarray(feature.int64_list.value, dtype=np.int64)
        else:
            out[name] = list(feature.bytes_list.value) if kind else []
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
