"""The synthetic click log: record layout, round trip, and a learnable signal."""

from __future__ import annotations

import numpy as np
import pytest

from flextrain.data import DataError, read_records
from flextrain.data.ctr import CTR_RECORD_BYTES, CTR_VOCAB, _generate, decode_ctr, encode_ctr, write_ctr


def test_roundtrip_and_files(tmp_path):
    info = write_ctr(tmp_path, rows=500, validation_fraction=0.2, seed=1)
    assert (info["train"], info["validation"]) == (400, 100)
    records = read_records(tmp_path / "train" / "ctr-00000.rio")
    assert len(records) == 400 and all(len(r) == CTR_RECORD_BYTES for r in records)
    ids, dense, labels = decode_ctr(records)
    assert ids.shape == (400, 4) and dense.shape == (400, 3) and set(np.unique(labels)) <= {0, 1}
    assert all(ids[:, f].max() < v for f, v in enumerate(CTR_VOCAB))
    again = decode_ctr(encode_ctr(ids, dense, labels))
    assert all(np.array_equal(a, b) for a, b in zip(again, (ids, dense, labels)))


def test_malformed_record_is_a_data_error():
    with pytest.raises(DataError, match="CTR record 0 in f.rio has 3 bytes"):
        decode_ctr([b"abc"], source="f.rio")


def test_labels_depend_on_features():
    ids, dense, labels = _generate(20000, seed=0)
    assert 0.2 < labels.mean() < 0.4
    # the click rate differs a lot between the most frequent ids of field 0
    rates = [labels[ids[:, 0] == i].mean() for i in range(5)]
    assert max(rates) - min(rates) > 0.2
