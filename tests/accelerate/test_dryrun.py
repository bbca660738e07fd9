"""dry_run and compare (what the automatic search builds on), and the data loader over a world."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import DistributedSampler

from accel_models import Block, BlockNet, TupleModel, mse, regression
from flextrain.accelerate import AccelerateError, Inputs, Method, Phase, Strategy, compare, dry_run, register, \
    sample_batches
from flextrain.accelerate.data import GlobalBatchSampler, build_dataloader
from flextrain.accelerate.patches import patches_of
from flextrain.elastic.world import World, WorldSource


@register
class _LearningRateTimes5(Method):
    """A deliberately wrong "optimization": the optimizer steps with 5x the learning rate."""

    name, phase = "test_lr_x5", Phase.CAST

    def apply(self, ctx, config):
        def wrap(opt):
            for group in opt.param_groups:
                group["lr"] *= 5
            return opt

        ctx.optimizer_wrappers.append(wrap)


def world(n, rank=0):
    return World(processes=n, rank=rank, devices_per_process=1, source=WorldSource.ENVIRONMENT)


def make_inputs(model=None, **kw):
    kw.setdefault("dataloader_args", {"batch_size": 64})
    kw.setdefault("loss_func", mse)
    return Inputs.checked(model or TupleModel(BlockNet()), optim_func=torch.optim.SGD, optim_args={"lr": 0.05},
                          dataset=regression(), **kw)


def test_dry_run_measures_speed_memory_and_losses_without_touching_the_model():
    inputs = make_inputs()
    before = copy.deepcopy(inputs.model.state_dict())
    r = dry_run([("amp_native", "bf16"), ("checkpoint", (Block,))], inputs, steps=3, warmup=1)
    assert r.ok and r.reason is None and r.samples_per_second > 0
    assert len(r.losses) == 4 and len(r.step_seconds) == 3
    held = sum(p.numel() * 4 for p in inputs.model.parameters())
    assert r.peak_bytes > 2 * held  # parameters + gradients at least
    assert all(torch.equal(a, b) for a, b in zip(before.values(), inputs.model.state_dict().values()))
    assert not any(patches_of(m) for m in inputs.model.modules())
    assert "samples/s" in r.describe()


def test_checkpointing_lowers_the_measured_peak():
    inputs = make_inputs(TupleModel(BlockNet(width=256, blocks=6)), dataloader_args={"batch_size": 256})
    batches = sample_batches(inputs, 3)
    plain = dry_run([], inputs, steps=1, batches=batches)
    ckpt = dry_run([("checkpoint", (Block,))], inputs, steps=1, batches=batches, reference=plain)
    assert ckpt.ok and plain.ok
    assert ckpt.peak_bytes < 0.8 * plain.peak_bytes
    assert ckpt.losses == pytest.approx(plain.losses, rel=1e-5)


def test_compare_accepts_faithful_strategies_and_rejects_a_loss_that_drifts():
    inputs = make_inputs()
    batches = sample_batches(inputs, 5)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, sample_batches(inputs, 5)))
    first = compare([("amp_native", "bf16")], inputs, batches=batches)
    assert first.accepted and first.speedup > 0 and first.memory_ratio > 0
    assert first.candidate.rtol == 0.05 and first.baseline.strategy == Strategy([])
    wrong = compare(["test_lr_x5"], inputs, baseline=first.baseline, batches=batches)
    assert not wrong.accepted and wrong.candidate.samples_per_second is None
    assert "loss at step 2" in wrong.candidate.reason and "the plain run's" in wrong.candidate.reason
    loose = compare(["test_lr_x5"], inputs, baseline=first.baseline, batches=batches, rtol=1e9)
    assert loose.accepted
    # a reference may also be a plain list of losses
    assert dry_run([], inputs, batches=batches, reference=first.baseline.losses).ok


def test_nonfinite_losses_and_failing_strategies_are_rejected_but_argument_errors_raise():
    inputs = make_inputs(loss_func=None)
    with pytest.raises(AccelerateError, match="a dry run needs loss_func"):
        dry_run([], inputs)
    nan = make_inputs(loss_func=lambda b, out: (out * float("nan")).mean())
    r = dry_run([], nan)
    assert not r.ok and "not finite" in r.reason
    with pytest.raises(AccelerateError, match="steps must be an integer >= 1"):
        dry_run([], make_inputs(), steps=0)


def test_an_uneven_global_batch_is_split_exactly_over_the_processes():
    shares = [list(GlobalBatchSampler(23, 10, world(3, r))) for r in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]
    for step in range(3):
        got = [i for s in shares for i in s[step]]
        assert got == list(range(step * 10, min(step * 10 + 10, 23))) if step < 2 else len(got) == 3
    assert [len(s[0]) for s in shares] == [4, 3, 3]  # the planner's split of 10 over 3
    assert [len(s[2]) for s in shares] == [1, 1, 1]  # the short last batch (3 samples) re-planned
    short = [list(GlobalBatchSampler(11, 10, world(3, r), drop_last=True)) for r in range(3)]
    assert [len(s) for s in short] == [1, 1, 1]
    padded = [list(GlobalBatchSampler(11, 10, world(3, r))) for r in range(3)]
    assert [s[1] for s in padded] == [[10], [10], [10]]  # 1 sample for 3 processes: repeated
    shuffled = [list(GlobalBatchSampler(20, 10, world(3, r), shuffle=True, seed=1)) for r in range(3)]
    assert sorted(i for s in shuffled for b in s for i in b) == list(range(20))


def test_the_loader_per_process_even_uneven_and_refusals():
    data = regression(64)
    loader, session = build_dataloader(data, {"batch_size": 16, "shuffle": True}, world(2, 1))
    assert isinstance(loader.sampler, DistributedSampler) and loader.batch_size == 8 and loader.sampler.shuffle
    assert session.batch_size == 8 and session.even
    loader, session = build_dataloader(data, {"batch_size": 15}, world(2, 0))
    assert isinstance(loader.batch_sampler, GlobalBatchSampler) and len(next(iter(loader))[0]) == 8
    with pytest.raises(AccelerateError, match="distributed_sampler_cls gives every process the same number"):
        build_dataloader(data, {"batch_size": 15}, world(2, 0), distributed_sampler_cls=DistributedSampler)
    with pytest.raises(AccelerateError, match=r'dataloader_args\["sampler"\] cannot be used with 2 processes'):
        build_dataloader(data, {"batch_size": 16, "sampler": range(64)}, world(2, 0))
    with pytest.raises(AccelerateError, match="global batch.*smaller than the data-parallel width"):
        build_dataloader(data, {"batch_size": 1}, world(2, 0))
    loader, _ = build_dataloader(data, {"batch_size": 16}, world(1))
    assert loader.batch_size == 16
