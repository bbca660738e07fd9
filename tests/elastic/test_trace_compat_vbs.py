"""``import flextrain.compat.vbs as vbs``: the reference's names, signatures and defaults."""

from __future__ import annotations

import pytest
import torch

import flextrain.compat.vbs as vbs
from flextrain.elastic.torch import AdaScaleOptimizer, SqrtRuleOptimizer, TraceBatchSampler


def test_custom_sampler_takes_a_dataset_or_its_size_and_the_references_defaults():
    data = torch.utils.data.TensorDataset(torch.arange(100.0))
    by_dataset = vbs.CustomSampler(data, [64, 128], num_replicas=2, rank=1)  # positional, as the reference
    by_size = vbs.CustomSampler(dataset_size=100, trace=[64, 128], num_replicas=2, rank=1, minibatch_size=32)
    assert isinstance(by_dataset, TraceBatchSampler)
    assert (by_dataset.seed, by_dataset.minibatch_size, by_dataset.dataset_size) == (42, 32, 100)
    assert list(by_dataset) == list(by_size)
    with pytest.raises(ValueError, match="dataset has 100 samples but dataset_size=99"):
        vbs.CustomSampler(data, 64, dataset_size=99, num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="dataset= .* or dataset_size="):
        vbs.CustomSampler(trace=64, num_replicas=1, rank=0)


def test_the_optimizers_take_the_references_arguments():
    net = torch.nn.Linear(2, 1)
    sampler = vbs.CustomSampler(dataset_size=64, trace=32, num_replicas=1, rank=0, minibatch_size=16)
    linear = vbs.LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, ref_batchsize=128,
                                     log_steps=10)
    assert linear.ref_batchsize == 128 and linear.log_steps == 10
    assert vbs.RootRuleOptimizer is SqrtRuleOptimizer and vbs.AdaScaleOptimizer is AdaScaleOptimizer
    ada = vbs.AdaScaleOptimizer(internal_optimizer=torch.optim.SGD(net.parameters(), lr=0.1), sampler=sampler,
                                ref_batchsize=32, log_steps=None)
    assert ada.gain == 1.0 and ada.progress == 0.0


def test_several_replicas_without_a_process_group_are_refused_before_a_step(monkeypatch):
    """num_replicas=2 (the reference reads it from XLA) in a script that never set up torch.distributed:
    rank 0 stepped alone on its half of G, silently (the update was half the global batch's)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    net = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in net.parameters()]
    sampler = vbs.CustomSampler(dataset_size=64, trace=32, num_replicas=2, rank=0, minibatch_size=16)
    optimizer = vbs.LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, ref_batchsize=32)
    sampler.set_epoch(0), optimizer.set_epoch(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 2))
    with pytest.raises(RuntimeError, match="num_replicas=2 but torch.distributed has no process group"):
        for (x,) in torch.utils.data.DataLoader(data, batch_sampler=sampler):
            net(x).sum().backward()
            optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))  # nothing applied
