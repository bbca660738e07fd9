"""The scikit-learn digits demo data set as RecordIO.

RECORD FORMAT (a contract: the model zoo decodes it):
    65 bytes = the 64 pixel values of the 8x8 image as uint8 (0..16,
    row-major) followed by the label as uint8 (0..9).

``write_digits`` uses the copy of the data bundled with scikit-learn, so it
works offline. scikit-learn is imported lazily: workers only need
``decode_digits``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from flextrain.data.errors import DataError
from flextrain.data.recordio import Compressor, write_records

__all__ = ["DIGITS_RECORD_BYTES", "write_digits", "decode_digits", "encode_digits"]

DIGITS_PIXELS = 64
DIGITS_RECORD_BYTES = DIGITS_PIXELS + 1
_MAX_PIXEL = 16
_NUM_CLASSES = 10
# The largest valid value of each byte of a record: 64 pixels, then the label.
_LIMITS = np.array([_MAX_PIXEL] * DIGITS_PIXELS + [_NUM_CLASSES - 1], dtype=np.uint8)


def encode_digits(images: np.ndarray, labels: np.ndarray) -> list[bytes]:
    """Encode ``images`` (n, 64) with values 0..16 and ``labels`` (n,) 0..9
    into 65-byte records."""
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.ndim != 2 or images.shape[1] != DIGITS_PIXELS or labels.shape != (images.shape[0],):
        raise ValueError(f"expected images (n, 64) and labels (n,), got {images.shape} and {labels.shape}")
    if images.size and (images.min() < 0 or images.max() > _MAX_PIXEL):
        raise ValueError("digits pixel values must be in 0..16")
    if labels.size and (labels.min() < 0 or labels.max() >= _NUM_CLASSES):
        raise ValueError("digits labels must be in 0..9")
    rows = np.concatenate([images.astype(np.uint8), labels.astype(np.uint8)[:, None]], axis=1)
    return [row.tobytes() for row in rows]


def write_digits(
    out_dir: str | os.PathLike[str],
    *,
    validation_fraction: float = 0.2,
    seed: int = 0,
    max_chunk_size: int = 64 * 1024,
) -> dict:
    """Write the digits set, shuffled with ``seed`` and split, as Snappy RecordIO.

    Files: ``out_dir/train/digits-00000.rio`` and
    ``out_dir/validation/digits-00000.rio`` (directories are created; existing
    files are overwritten). ``0 < validation_fraction < 1``; both splits get
    at least one record. The small default ``max_chunk_size`` gives several
    chunks, so ranged reads stay cheap.

    Returns ``{"train": n_train, "validation": n_val, "out_dir": str}``.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    from sklearn.datasets import load_digits  # lazy: slow import, writer-only

    bunch = load_digits()
    images, labels = bunch.data, bunch.target
    n = len(labels)
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(n - 1, max(1, round(n * validation_fraction)))
    splits = {"validation": order[:n_val], "train": order[n_val:]}

    out_dir = os.fspath(out_dir)
    for split, idx in splits.items():
        split_dir = os.path.join(out_dir, split)
        os.makedirs(split_dir, exist_ok=True)
        write_records(
            os.path.join(split_dir, "digits-00000.rio"),
            encode_digits(images[idx], labels[idx]),
            compressor=Compressor.SNAPPY,
            max_chunk_size=max_chunk_size,
        )
    return {"train": len(splits["train"]), "validation": n_val, "out_dir": out_dir}


def decode_digits(records: Sequence[bytes], *, source: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode 65-byte digits records into model inputs.

    Returns ``(x, y)``: x float32 of shape (n, 64) scaled to [0, 1] (pixel /
    16), y int64 of shape (n,). Raises DataError naming the first bad record
    (and ``source``, the file it came from, when given) if a record does not
    have 65 bytes or holds an out-of-range pixel or label.
    """
    where = f" from {source}" if source else ""
    # Check every length, not just the total: a 64- and a 66-byte record
    # would sum correctly but misalign everything after them.
    if any(n != DIGITS_RECORD_BYTES for n in set(map(len, records))):
        for i, rec in enumerate(records):  # slow path only on error
            if len(rec) != DIGITS_RECORD_BYTES:
                raise DataError(
                    f"digits record {i}{where} has {len(rec)} bytes, expected {DIGITS_RECORD_BYTES} "
                    "(64 pixels + 1 label)"
                )
    rows = np.frombuffer(b"".join(records), dtype=np.uint8).reshape(len(records), DIGITS_RECORD_BYTES)
    pixels, labels = rows[:, :DIGITS_PIXELS], rows[:, DIGITS_PIXELS]
    # One comparison against the per-byte limits (a worker decodes every step: the per-record
    # search below costs several times more, so it runs only to name a bad record).
    if (rows > _LIMITS).any():
        i = int(np.flatnonzero((pixels > _MAX_PIXEL).any(axis=1) | (labels >= _NUM_CLASSES))[0])
        raise DataError(
            f"digits record {i}{where} is not a digits record: pixels must be 0..16 and the label 0..9, "
            f"got max pixel {int(pixels[i].max())} and label {int(labels[i])}"
        )
    x = np.multiply(pixels, np.float32(1 / _MAX_PIXEL), dtype=np.float32)  # exact: 1/16 is a power of two
    y = labels.astype(np.int64)
    return x, y
