"""The digits demo data set: writing, the 65-byte record contract, decoding."""

from __future__ import annotations

import numpy as np
import pytest

from flextrain.data import (
    DIGITS_RECORD_BYTES,
    DataError,
    decode_digits,
    encode_digits,
    make_shards,
    read_records,
    write_digits,
)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    return out, write_digits(out)


def test_write_digits_counts_and_layout(digits_dir):
    out, info = digits_dir
    assert info == {"train": 1438, "validation": 359, "out_dir": str(out)}
    assert info["train"] + info["validation"] == 1797
    for split in ("train", "validation"):
        shards = make_shards(out / split)
        assert [s.source for s in shards] == [str(out / split / "digits-00000.rio")]
        assert shards[0].size == info[split]


def test_records_follow_the_contract(digits_dir):
    out, _ = digits_dir
    from sklearn.datasets import load_digits

    bunch = load_digits()
    order = np.random.default_rng(0).permutation(1797)  # write_digits' documented shuffle
    train = read_records(out / "train" / "digits-00000.rio")
    assert DIGITS_RECORD_BYTES == 65 and {len(r) for r in train} == {65}
    first = np.frombuffer(train[0], dtype=np.uint8)
    assert np.array_equal(first[:64], bunch.data[order[359]].astype(np.uint8))
    assert first[64] == bunch.target[order[359]]


def test_decode(digits_dir):
    out, info = digits_dir
    x, y = decode_digits(read_records(out / "validation" / "digits-00000.rio"))
    assert x.shape == (info["validation"], 64) and x.dtype == np.float32
    assert y.shape == (info["validation"],) and y.dtype == np.int64
    assert 0.0 <= x.min() and x.max() == 1.0
    assert set(y.tolist()) == set(range(10))
    xt, yt = decode_digits(read_records(out / "train" / "digits-00000.rio"))
    assert set(yt.tolist()) == set(range(10))
    assert np.allclose(xt * 16, np.round(xt * 16))  # exact multiples of 1/16


def test_split_is_seeded(tmp_path):
    a = write_digits(tmp_path / "a", seed=3, validation_fraction=0.5)
    b = write_digits(tmp_path / "b", seed=3, validation_fraction=0.5)
    assert (a["train"], a["validation"]) == (899, 898)
    for split in ("train", "validation"):
        assert read_records(tmp_path / "a" / split / "digits-00000.rio") == read_records(
            tmp_path / "b" / split / "digits-00000.rio"
        )


def test_encode_decode_roundtrip():
    images = np.arange(3 * 64).reshape(3, 64) % 17
    labels = np.array([0, 9, 4])
    x, y = decode_digits(encode_digits(images, labels))
    assert np.allclose(x * 16, images) and y.tolist() == [0, 9, 4]
    x, y = decode_digits([])
    assert x.shape == (0, 64) and y.shape == (0,)


def test_decode_rejects_bad_records():
    good = bytes(64) + b"\x03"
    with pytest.raises(DataError, match=r"record 1 from /d/t\.rio has 64 bytes, expected 65"):
        decode_digits([good, good[:-1], good + b"!"], source="/d/t.rio")
    with pytest.raises(DataError, match="record 2 is not a digits record"):
        decode_digits([good, good, bytes(64) + b"\x0a"])
    with pytest.raises(DataError, match="record 0 is not a digits record"):
        decode_digits([b"\x11" + bytes(63) + b"\x01"])


def test_bad_fraction(tmp_path):
    for fraction in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError):
            write_digits(tmp_path, validation_fraction=fraction)
