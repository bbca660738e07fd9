"""TraceBatchSampler: exactly-once coverage per epoch for any trace and world, len, layout, bad traces."""

from __future__ import annotations

from collections import Counter

import pytest

from flextrain.elastic.schedule import ScheduleError
from flextrain.elastic.torch import TraceBatchSampler

# (dataset size, minibatch, trace as global batches per step) — the trace is scaled by the world below
CASES = [
    (100, 2, [2, 2, 4, 4, 8]),        # sizes change mid-epoch; the trace ends mid-epoch 0, its last size holds
    (37, 1, [4, 8, 2, 6]),            # odd dataset: every epoch ends with a partial step
    (50, 3, [6, 12, 24, 6, 6, 18]),   # steps spanning where an epoch ends: partial steps of various sizes
    (9, 4, [8]),                      # a step larger than an epoch: each epoch is one partial step
]


def all_ranks(size, trace, world, b, epoch):
    samplers = [TraceBatchSampler(size, [g * world for g in trace], world, r, minibatch_size=b, seed=5)
                for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return samplers


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("size, b, trace", CASES)
def test_every_sample_exactly_once_per_epoch(size, b, trace, world):
    for epoch in range(4):
        samplers = all_ranks(size, trace, world, b, epoch)
        seen = Counter()
        for s in samplers:
            batches = list(s)
            assert len(batches) == len(s), "len is what iteration yields"
            assert all(0 < len(mb) <= b for mb in batches)
            seen.update(i for mb in batches for i in mb)
        assert seen == Counter(range(size)), f"epoch {epoch}: not exactly once"
        # every rank agrees on the steps, and each step's minibatches add up to its samples
        layouts = [s.shares() for s in samplers]
        assert len({tuple(sh.step for sh in lay) for lay in layouts}) == 1
        for k, share in enumerate(layouts[0]):
            assert sum(sum(lay[k].minibatches) for lay in layouts) == share.samples
            assert sum(len(lay[k].minibatches) for lay in layouts) == share.total_minibatches
            g = samplers[0].global_batch(share.step)
            # only an epoch's last step may be partial
            assert share.samples == g or (k == len(layouts[0]) - 1 and share.samples < g)
        assert sum(sh.samples for sh in layouts[0]) == size


def test_steps_continue_across_epochs_and_full_steps_follow_the_trace():
    s = TraceBatchSampler(10, [2, 4, 4, 6], 2, 0, minibatch_size=1, seed=0)
    # epoch 0: steps 0 (2), 1 (4), 2 (4) = 10; epoch 1: step 3 (6), step 4 (partial 4 of 6)
    assert [(sh.step, sh.samples) for sh in s.shares()] == [(0, 2), (1, 4), (2, 4)]
    assert [s.step_of_minibatch(i) for i in range(len(s))] == [0, 1, 1, 2, 2]
    s.set_epoch(1)
    assert s.first_step() == 3
    assert [(sh.step, sh.samples, sh.minibatches) for sh in s.shares()] == [(3, 6, (1, 1, 1)), (4, 4, (1, 1))]
    assert s.minibatches_in_step(4) == 2 and len(s) == 5
    s.set_epoch(5)  # past the trace: 6 per step, 10 samples -> 2 steps (6 + partial 4) per epoch
    assert s.first_step() == 3 + 2 * 4 and [sh.samples for sh in s.shares()] == [6, 4]


def test_a_rank_without_a_share_of_a_partial_step():
    # 13 samples, steps of 12 over 3 ranks: the partial step has 1 sample, only rank 0 gets it
    shares = [TraceBatchSampler(13, 12, 3, r, minibatch_size=2).shares() for r in range(3)]
    assert [sh[-1].minibatches for sh in shares] == [(1,), (), ()]
    assert [len(TraceBatchSampler(13, 12, 3, r, minibatch_size=2)) for r in range(3)] == [3, 2, 2]


def test_full_steps_split_evenly_into_minibatches_of_the_given_size():
    s = TraceBatchSampler(64, [16, 32], 2, 1, minibatch_size=4, shuffle=False)
    batches = list(s)
    assert batches[:2] == [[8, 9, 10, 11], [12, 13, 14, 15]]  # step 0: rank 1 takes samples 8..15
    assert batches[2:6] == [list(range(32, 36)), list(range(36, 40)), list(range(40, 44)), list(range(44, 48))]


def test_shuffling_is_deterministic_by_seed_and_epoch():
    def order(seed, epoch):
        s = TraceBatchSampler(40, 8, 2, 0, minibatch_size=2, seed=seed)
        s.set_epoch(epoch)
        return list(s)
    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0)


def test_start_skips_minibatches_to_resume():
    s = TraceBatchSampler(40, [8, 16], 2, 0, minibatch_size=2, seed=3)
    full = list(s)
    s.set_epoch(0, start=3)
    assert list(s) == full[3:] and len(s) == len(full) - 3


def test_the_world_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    s = TraceBatchSampler(30, 6, minibatch_size=2)
    assert (s.num_replicas, s.rank) == (3, 2)


def test_a_size_not_a_multiple_of_minibatch_times_replicas_names_the_step_and_the_line(tmp_path):
    with pytest.raises(ScheduleError, match=r"step 2: batch size 12 is not a multiple of minibatch_size x "
                                            r"num_replicas \(4 x 2\) \(8\)"):
        TraceBatchSampler(100, [8, 16, 12], 2, 0, minibatch_size=4)
    path = tmp_path / "trace.csv"
    path.write_text("step,batchsize\n0,8\n1,x\n")
    with pytest.raises(ScheduleError, match=r"trace.csv: line 3: batchsize: 'x' is not an integer"):
        TraceBatchSampler(100, path, 2, 0, minibatch_size=4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dataset_size=2, trace=4, num_replicas=3, rank=0, minibatch_size=1), "below num_replicas"),
    (dict(dataset_size=10, trace=4, num_replicas=2, rank=2, minibatch_size=1), r"rank must lie in \[0, 2\)"),
    (dict(dataset_size=10, trace=4, num_replicas=2, rank=0, minibatch_size=0), "minibatch_size must be"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TraceBatchSampler(**kwargs)
