"""The batch planner (DESIGN.md, "Elastic batch semantics")."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from flextrain.elastic.planner import StepPlan, plan_step


def _check_invariants(plan: StepPlan, G: int, N: int, M: int) -> None:
    k = plan.accumulation_steps
    where = f"G={G} N={N} M={M}: {plan}"
    assert plan.global_batch == G and plan.world_size == N, where
    assert k == math.ceil(G / (N * M)), where
    assert len(plan.micro_batches) == N * k, where
    assert sum(plan.micro_batches) == G, where
    assert max(plan.micro_batches) - min(plan.micro_batches) <= 1, where
    assert max(plan.micro_batches) <= M, where  # every micro-batch fits in a worker

    cursor = 0
    for rank in range(N):
        parts = plan.slices(rank)
        assert len(parts) == k, where
        assert [size for _, size in parts] == list(plan.micro_batches[rank * k : (rank + 1) * k]), where
        for offset, size in parts:
            assert offset == cursor, f"{where}: rank {rank} slice at {offset}, expected {cursor}"
            cursor += size
        lo, hi = plan.span(rank)
        assert lo == parts[0][0] and hi == parts[-1][0] + parts[-1][1], where
        assert hi - lo == sum(size for _, size in parts), where
    assert cursor == G, where


@pytest.mark.parametrize("workers, k", [(1, 4), (2, 2), (4, 1)])
def test_design_table_g256_m64(workers, k):
    plan = plan_step(256, workers, 64)
    assert plan.accumulation_steps == k
    assert plan.micro_batches == (64,) * (workers * k)
    _check_invariants(plan, 256, workers, 64)


def test_more_workers_than_needed_keeps_one_step():
    plan = plan_step(256, 8, 64)
    assert plan.accumulation_steps == 1
    assert plan.micro_batches == (32,) * 8


@pytest.mark.parametrize("M, k", [(64, 1), (16, 3)])
def test_uneven_split_g100_over_three_workers(M, k):
    plan = plan_step(100, 3, M)
    assert plan.accumulation_steps == k
    assert len(plan.micro_batches) == 3 * k
    assert sum(plan.micro_batches) == 100
    assert max(plan.micro_batches) - min(plan.micro_batches) <= 1
    covered = []
    for rank in range(3):
        parts = plan.slices(rank)
        # each rank's micro-batches are back to back: one contiguous read per step
        for (o1, s1), (o2, _) in zip(parts, parts[1:]):
            assert o1 + s1 == o2
        covered.extend(range(parts[0][0], parts[-1][0] + parts[-1][1]))
    assert covered == list(range(100))  # no gap, no overlap, in rank order
    _check_invariants(plan, 100, 3, M)


def test_uneven_split_exact_sizes():
    assert plan_step(100, 3, 64).micro_batches == (34, 33, 33)
    plan = plan_step(100, 3, 16)
    assert plan.micro_batches == (12,) + (11,) * 8
    assert plan.slices(0) == ((0, 12), (12, 11), (23, 11))
    assert plan.slices(1) == ((34, 11), (45, 11), (56, 11))
    assert plan.slices(2) == ((67, 11), (78, 11), (89, 11))
    assert [plan.span(r) for r in range(3)] == [(0, 34), (34, 67), (67, 100)]


def test_global_batch_smaller_than_world():
    plan = plan_step(3, 5, 64)
    assert plan.accumulation_steps == 1
    assert plan.micro_batches == (1, 1, 1, 0, 0)
    assert sum(plan.micro_batches) == 3
    assert [plan.span(r) for r in range(5)] == [(0, 1), (1, 2), (2, 3), (3, 3), (3, 3)]
    assert plan.slices(4) == ((3, 0),)
    _check_invariants(plan, 3, 5, 64)


@pytest.mark.parametrize(
    "args", [(0, 1, 1), (-5, 1, 1), (10, 0, 4), (10, -1, 4), (10, 2, 0), (10, 2, -3)]
)
def test_invalid_inputs_raise(args):
    with pytest.raises(ValueError, match="must be positive"):
        plan_step(*args)


@pytest.mark.parametrize("rank", [-1, 3, 100])
def test_rank_outside_world_raises(rank):
    plan = plan_step(100, 3, 16)
    with pytest.raises(ValueError, match="outside world"):
        plan.slices(rank)
    with pytest.raises(ValueError, match="outside world"):
        plan.span(rank)


def test_invariants_over_many_combinations():
    Gs = [1, 2, 3, 7, 31, 64, 99, 100, 127, 128, 255, 256, 257, 1000, 1023]
    Ns = [1, 2, 3, 4, 5, 7, 8, 16]
    Ms = [1, 2, 3, 8, 16, 63, 64, 100, 512]
    count = 0
    for G, N, M in itertools.product(Gs, Ns, Ms):
        _check_invariants(plan_step(G, N, M), G, N, M)
        count += 1
    assert count == len(Gs) * len(Ns) * len(Ms)


def test_plan_is_deterministic_and_hashable():
    assert plan_step(100, 3, 16) == plan_step(100, 3, 16)
    assert hash(plan_step(100, 3, 16)) == hash(plan_step(100, 3, 16))
    assert plan_step(100, 3, 16) != plan_step(100, 4, 16)


@pytest.mark.parametrize("G, N, M", [(100, 3, 16), (10, 4, 2), (3, 5, 64), (256, 2, 64), (37, 3, 5)])
def test_scaled_micro_batch_gradients_equal_full_batch_gradient(G, N, M):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2).double()
    x = torch.randn(G, 5, dtype=torch.float64)
    y = torch.randn(G, 2, dtype=torch.float64)
    loss_fn = torch.nn.MSELoss()  # the mean over the samples given (the module contract)

    model.zero_grad()
    loss_fn(model(x), y).backward()
    full = [p.grad.clone() for p in model.parameters()]

    plan = plan_step(G, N, M)
    model.zero_grad()
    used = 0
    for rank in range(N):  # summing over ranks is what the allreduce does
        for offset, size in plan.slices(rank):
            if size == 0:
                continue
            sl = slice(offset, offset + size)
            (loss_fn(model(x[sl]), y[sl]) * (size / G)).backward()
            used += size
    assert used == G
    for got, want in zip((p.grad for p in model.parameters()), full):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)

    if len(set(plan.micro_batches) - {0}) > 1:
        # Sanity: averaging micro-batch means (ignoring sizes) would be wrong for uneven splits.
        model.zero_grad()
        sizes = [s for s in plan.micro_batches if s]
        offset = 0
        for size in sizes:
            sl = slice(offset, offset + size)
            (loss_fn(model(x[sl]), y[sl]) / len(sizes)).backward()
            offset += size
        assert not all(torch.allclose(p.grad, w) for p, w in zip(model.parameters(), full))
