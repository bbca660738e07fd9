"""A synthetic click log for CTR models (``flextrain data ctr``).

Each record is ``CTR_RECORD_BYTES`` little-endian bytes: ``CTR_FIELDS`` int64
categorical ids (field ``f`` draws from ``CTR_VOCAB[f]`` ids, Zipf-like, so
some ids are frequent and many rare), ``CTR_DENSE`` float32 dense features and
one uint8 label (1 = click). The label is drawn from a logistic model with a
hidden weight per (field, id), a pairwise interaction between fields 0 and 1
and a linear term in the dense features, so a model with embeddings can learn
it: the Bayes AUC is well above 0.5 and the click rate is about 30 %.

Files: ``out/train/ctr-00000.rio`` and ``out/validation/ctr-00000.rio``
(Snappy RecordIO, several chunks, like ``flextrain data digits``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from flextrain.data.errors import DataError
from flextrain.data.recordio import Compressor, write_records

__all__ = ["CTR_FIELDS", "CTR_DENSE", "CTR_VOCAB", "CTR_RECORD_BYTES", "write_ctr", "decode_ctr", "encode_ctr"]

CTR_FIELDS = 4
CTR_DENSE = 3
CTR_VOCAB = (1000, 500, 200, 50)
CTR_RECORD_BYTES = CTR_FIELDS * 8 + CTR_DENSE * 4 + 1


def encode_ctr(ids: np.ndarray, dense: np.ndarray, labels: np.ndarray) -> list[bytes]:
    """Records for ``ids [n, CTR_FIELDS]``, ``dense [n, CTR_DENSE]``, ``labels [n]`` (0/1)."""
    ids = np.ascontiguousarray(ids, dtype="<i8")
    dense = np.ascontiguousarray(dense, dtype="<f4")
    labels = np.ascontiguousarray(labels, dtype=np.uint8)
    return [ids[i].tobytes() + dense[i].tobytes() + labels[i: i + 1].tobytes() for i in range(len(labels))]


def decode_ctr(records: Sequence[bytes], *, source: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids int64 [n, CTR_FIELDS], dense float32 [n, CTR_DENSE], labels int64 [n])``; DataError if malformed."""
    bad = next((i for i, r in enumerate(records) if len(r) != CTR_RECORD_BYTES), None)
    if bad is not None:
        where = f" in {source}" if source else ""
        raise DataError(f"CTR record {bad}{where} has {len(records[bad])} bytes, expected {CTR_RECORD_BYTES}")
    buf = np.frombuffer(b"".join(records), dtype=np.uint8).reshape(len(records), CTR_RECORD_BYTES)
    ids = buf[:, : CTR_FIELDS * 8].copy().view("<i8").astype(np.int64)
    dense = buf[:, CTR_FIELDS * 8: CTR_FIELDS * 8 + CTR_DENSE * 4].copy().view("<f4").astype(np.float32)
    labels = buf[:, -1].astype(np.int64)
    return ids.reshape(len(records), CTR_FIELDS), dense.reshape(len(records), CTR_DENSE), labels


def _generate(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = np.random.default_rng(12345)  # the hidden model is the same for every seed
    ids = np.empty((rows, CTR_FIELDS), dtype=np.int64)
    logit = np.full(rows, -1.2)
    for f, vocab in enumerate(CTR_VOCAB):
        p = 1.0 / np.arange(1, vocab + 1) ** 0.8
        ids[:, f] = rng.choice(vocab, size=rows, p=p / p.sum())
        logit += truth.normal(0.0, 1.0, vocab)[ids[:, f]]
    inter = truth.normal(0.0, 1.0, (8, 8))
    logit += inter[ids[:, 0] % 8, ids[:, 1] % 8]
    dense = rng.normal(0.0, 1.0, (rows, CTR_DENSE)).astype(np.float32)
    logit += dense @ truth.normal(0.0, 0.8, CTR_DENSE)
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.uint8)
    return ids, dense, labels


def write_ctr(out_dir: str | os.PathLike[str], *, rows: int = 20000, validation_fraction: float = 0.2,
              seed: int = 0, max_chunk_size: int = 64 * 1024) -> dict:
    """Write ``rows`` click records split into train/validation; returns counts and the click rate."""
    if rows < 2:
        raise ValueError(f"rows must be >= 2, got {rows}")
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    ids, dense, labels = _generate(rows, seed)
    n_val = min(rows - 1, max(1, round(rows * validation_fraction)))
    splits = {"validation": slice(0, n_val), "train": slice(n_val, rows)}
    out_dir = os.fspath(out_dir)
    for split, sl in splits.items():
        split_dir = os.path.join(out_dir, split)
        os.makedirs(split_dir, exist_ok=True)
        write_records(os.path.join(split_dir, "ctr-00000.rio"), encode_ctr(ids[sl], dense[sl], labels[sl]),
                      compressor=Compressor.SNAPPY, max_chunk_size=max_chunk_size)
    return {"train": rows - n_val, "validation": n_val, "out_dir": out_dir,
            "positive_rate": float(labels.mean())}
