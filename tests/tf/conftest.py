"""Data for the TensorFlow tests: the digits demo set as tf.train.Example records."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def digits_examples(tmp_path_factory) -> Path:
    from flextrain.data.example import write_digits_examples

    out = tmp_path_factory.mktemp("digits-examples")
    write_digits_examples(out)
    return out
