"""Fixtures of the TensorFlow tests: the digits demo set as tf.train.Example records, two PS."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def digits_examples(tmp_path_factory) -> Path:
    from flextrain.data.example import write_digits_examples

    out = tmp_path_factory.mktemp("digits-examples")
    write_digits_examples(out)
    return out


@pytest.fixture
def two_ps():
    """Two in-process parameter servers (addresses), stopped after the test."""
    from flextrain.ps.main import start_ps

    handles = [start_ps(shard_index=i, num_ps=2, host="127.0.0.1") for i in range(2)]
    yield [h.address for h in handles]
    for h in handles:
        h.stop(grace=0.2, checkpoint=False)
