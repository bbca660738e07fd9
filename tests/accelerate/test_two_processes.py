"""The data-parallel methods in a real 2-process gloo group (one launch runs every scenario)."""

from __future__ import annotations

import pytest

from ft_helpers import run_two_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_two_ranks(tmp_path_factory.mktemp("ranks"), "accelerate/accel_two_ranks.py")


def test_parallel_mode_wraps_in_ddp_and_splits_the_global_batch(ranks):
    for rank, r in enumerate(ranks):
        d = r["ddp"]
        assert d["wrapper"] == "DistributedDataParallel" and d["parallel_mode"] == 2 and d["dry_run_ok"]
        assert d["loader_batch"] == 16 and d["sampler"] == "DistributedSampler" and d["rank_of_sampler"] == rank
        assert d["last"] < d["first"] and d["same"]


def test_zero1_shards_the_optimizer_state(ranks):
    local = [r["zero1"]["local_state_numel"] for r in ranks]
    total = ranks[0]["zero1"]["total_numel"]
    assert sum(local) == total and all(0 < n < total for n in local)  # each rank holds only its part
    for r in ranks:
        z = r["zero1"]
        assert z["optimizer"] == "ZeroRedundancyOptimizer" and z["wrapper"] == "DistributedDataParallel"
        assert z["last"] < z["first"] and z["same"]


@pytest.mark.parametrize("name", ["fsdp2", "zero2"])
def test_fsdp2_and_zero2_shard_the_parameters_on_cpu(ranks, name):
    for r in ranks:
        s = r[name]
        assert s["dtensors"] and s["local_numel"] < s["total_numel"]
        assert s["last"] < s["first"] and s["same"]
    assert "FSDP1 settings ignored: limit_all_gathers" in " ".join(ranks[0]["zero2"]["notes"])


def test_an_uneven_global_batch_gives_the_exact_mean_gradient(ranks):
    assert [r["uneven"]["local_batch"] for r in ranks] == [8, 7]
    assert all(r["uneven"]["exact"] and r["uneven"]["steps"] == 4 for r in ranks)


def test_compare_runs_in_both_processes_against_ddp(ranks):
    for r in ranks:
        c = r["compare"]
        assert c["baseline"] == ["parallel_mode"] and c["accepted"], c["reason"]
        assert c["sps"] > 0 and c["peak"] > 0
    assert ranks[0]["compare"]["sps"] == ranks[1]["compare"]["sps"]  # agreed over the processes


def test_the_automatic_search_applies_one_strategy_on_both_processes(ranks):
    first, second = (r["auto"] for r in ranks)
    assert first["status"] and second["status"]
    assert first["strategy"] == second["strategy"] and first["rows"] == second["rows"]  # one decision, agreed
    names = first["names"]
    assert names[0] == "parallel_mode" and "module_replace" in names
    labels = [row[0] for row in first["rows"]]
    assert labels[0] == "parallel_mode"  # the plain run of a 2-process world: DDP alone
    assert {"parallel_mode + zero1", "parallel_mode + zero2", "parallel_mode + fsdp2"} <= set(labels)
    assert all(label.startswith("parallel_mode") for label in labels)
    for r in (first, second):
        assert r["wrapper"] == "DistributedDataParallel" and r["loader_batch"] == 64
        assert r["last"] < r["first"] and r["same"]
