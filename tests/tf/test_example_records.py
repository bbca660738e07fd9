"""tf.train.Example records written and read without TensorFlow, and checked against TensorFlow's parser."""

from __future__ import annotations

import numpy as np
import pytest

from ft_helpers import run_flextrain
from flextrain.data import DataError, read_records
from flextrain.data.digits import decode_digits, write_digits
from flextrain.data.example import check_features, decode_example, encode_example


def test_round_trip_of_every_kind():
    record = encode_example({"f": np.array([0.5, -2.0, 3.25], dtype=np.float32), "i": [-5, 0, 2**63 - 1],
                             "b": [b"x", b""], "s": "text"})
    got = decode_example(record)
    np.testing.assert_array_equal(got["f"], np.array([0.5, -2.0, 3.25], dtype=np.float32))
    np.testing.assert_array_equal(got["i"], np.array([-5, 0, 2**63 - 1], dtype=np.int64))
    assert got["b"] == [b"x", b""] and got["s"] == [b"text"]


def test_unpacked_lists_are_read_too():
    # int64_list {value: 7 value: -1} written unpacked (one varint field per value), as old writers may
    def varint(v):
        v &= (1 << 64) - 1
        out = bytearray()
        while v > 0x7F:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))

    def field(n, payload):
        return varint(n << 3 | 2) + varint(len(payload)) + payload
    int_list = varint(1 << 3) + varint(7) + varint(1 << 3) + varint(-1)
    entry = field(1, b"k") + field(2, field(3, int_list))
    assert decode_example(field(1, field(1, entry)))["k"].tolist() == [7, -1]


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="'big'.*int64 range"):
        encode_example({"big": [2**63]})
    with pytest.raises(ValueError, match="'e' is empty"):
        encode_example({"e": []})
    with pytest.raises(DataError, match="record 4 of x.rio is not a serialized tf.train.Example"):
        decode_example(b"\x0a\xff\xff", where="record 4 of x.rio")
    with pytest.raises(DataError, match="feature 'label' should be 1 int64"):
        check_features({"label": np.zeros(2, np.int64)}, {"label": ("int64", 1)}, where="rec")


def test_cli_writes_digits_as_examples_with_the_same_content(tmp_path):
    proc = run_flextrain("data", "digits", "--out", str(tmp_path / "ex"), "--format", "example")
    assert proc.returncode == 0, proc.stderr
    write_digits(tmp_path / "raw")
    for split in ("train", "validation"):
        examples = read_records(tmp_path / "ex" / split / "digits-00000.rio")
        pixels, labels = decode_digits(read_records(tmp_path / "raw" / split / "digits-00000.rio"))
        assert len(examples) == len(labels)
        for i in (0, len(labels) // 2, len(labels) - 1):
            got = decode_example(examples[i])
            np.testing.assert_array_equal(got["image"], pixels[i] * 16)
            assert got["label"].tolist() == [labels[i]]
