"""Routing: stable across processes (no salted hash), balanced, and strict about ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from flextrain.protocol.shard import INT64_MAX, as_row_ids, dense_owner, row_owner, row_owners

NAMES = [f"layer{i}.{kind}" for i in range(200) for kind in ("weight", "bias")] + ["embedding.weight", "héllo"]
IDS = [0, 1, 2, 3, 1000, 2**31, 2**40 + 7, INT64_MAX]
PINNED_DENSE = [3, 3, 3, 1, 2, 3]  # crc32 % 4 of the names in test_known_values_never_change


def test_owners_are_identical_in_other_processes_with_other_hash_seeds():
    code = ("import json, sys; from flextrain.protocol.shard import dense_owner, row_owner; "
            "names, ids = json.load(sys.stdin); "
            "print(json.dumps([[dense_owner(n, k) for n in names] for k in (1, 2, 3, 7)] + "
            "[[row_owner(i, k) for i in ids] for k in (1, 2, 3, 7)]))")
    here = ([[dense_owner(n, k) for n in NAMES] for k in (1, 2, 3, 7)]
            + [[row_owner(i, k) for i in IDS] for k in (1, 2, 3, 7)])
    for seed in ("1", "12345"):
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps([NAMES, IDS]), capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert json.loads(out.stdout) == here


def test_known_values_never_change():
    # Pinned: a different rule would send a running job's parameters and rows to the wrong PS.
    names = ("fc.weight", "fc.bias", "emb", "layer1.weight", "layer2.weight", "out.bias")
    assert [dense_owner(n, 4) for n in names] == PINNED_DENSE
    assert [row_owner(i, 5) for i in (0, 1, 2, 3, 4, 2**40)] == [0, 4, 0, 1, 2, 3]
    assert row_owners(np.array(IDS, dtype=np.int64), 7).tolist() == [row_owner(i, 7) for i in IDS]


def test_dense_names_are_balanced():
    counts = Counter(dense_owner(f"model.block{i}.param{j}", 4) for i in range(250) for j in range(4))
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) < 1.2 * 250 and min(counts.values()) > 0.8 * 250


@pytest.mark.parametrize("stride", [1, 2, 4, 1000])
def test_row_ids_are_balanced_even_when_strided(stride):
    ids = np.arange(0, 40_000 * stride, stride, dtype=np.int64)
    counts = np.bincount(row_owners(ids, 4), minlength=4)
    assert counts.min() > 0.9 * 10_000 and counts.max() < 1.1 * 10_000


def test_vectorised_and_scalar_row_owner_agree():
    ids = np.random.default_rng(0).integers(0, INT64_MAX, size=1000, dtype=np.int64)
    assert row_owners(ids, 3).tolist() == [row_owner(int(i), 3) for i in ids]


@pytest.mark.parametrize("bad,shown", [([1, -5], "-5"), ([2**63], str(2**63)), (np.array([2**64 - 1], dtype=np.uint64),
                                       str(2**64 - 1)), ([1, 2**70], str(2**70)), ([-1, 2**64], "-1")])
def test_bad_ids_name_the_table_and_the_id(bad, shown):
    with pytest.raises(ValueError) as err:
        as_row_ids(bad, "user_emb")
    assert "user_emb" in str(err.value) and shown in str(err.value)


def test_non_integer_ids_are_rejected():
    with pytest.raises(ValueError, match="'t': ids must be integers"):
        as_row_ids(np.array([1.5]), "t")
    with pytest.raises(ValueError, match="'t': ids must be integers"):
        as_row_ids([True], "t")
    with pytest.raises(ValueError, match="out of range"):
        row_owner(-1, 2)
    with pytest.raises(ValueError, match="num_ps"):
        dense_owner("x", 0)


def test_distinct_by_owner_groups_each_ps_ids_in_one_ascending_range():
    from flextrain.protocol.shard import distinct_by_owner, owner_bounds
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 1 << 40, 3000).astype(np.int64)
    ids[::7] = ids[3]  # repeats
    for num_ps in (1, 2, 3):
        distinct, inverse = distinct_by_owner(ids, num_ps)
        assert np.array_equal(distinct[inverse], ids) and len(distinct) == len(np.unique(ids))
        owners = row_owners(distinct, num_ps)
        bounds = owner_bounds(distinct, owners, num_ps)
        assert bounds is not None and bounds[0] == 0 and bounds[-1] == len(distinct)
        for i in range(num_ps):
            part = distinct[bounds[i]: bounds[i + 1]]
            assert (row_owners(part, num_ps) == i).all() and (np.diff(part) > 0).all()
    # Any other layout is recognised as such (the client then gathers/scatters).
    two = distinct_by_owner(ids, 2)[0]
    assert owner_bounds(np.sort(two), row_owners(np.sort(two), 2), 2) is None  # ascending, not grouped
    swapped = two.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # grouped, but not ascending inside a group
    assert owner_bounds(swapped, row_owners(swapped, 2), 2) is None
