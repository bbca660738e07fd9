"""``flextrain.elastic.torch.init(G, "auto", ...)``: M probed under a memory limit, cached, agreed by
every rank (the smallest), and clear errors when what the probe needs is missing."""

from __future__ import annotations

import copy

import pytest
import torch

import flextrain.elastic.torch as elastic
from flextrain.elastic.memory import step_peak
from flextrain.elastic.probe import training_step
from flextrain.elastic.session import ElasticInitError
from ft_helpers import run_two_ranks


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def sample(n=48):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def peak_at(size: int) -> int:
    m = model()
    x, y = sample()
    reps = -(-size // len(x))
    step = training_step(m, torch.optim.Adam(m.parameters()), torch.nn.functional.cross_entropy,
                         lambda k: (x.repeat(reps, 1)[:k], y.repeat(reps)[:k]))
    return step_peak(lambda: step(size), baseline=step.baseline_bytes).peak_bytes


def test_auto_probes_the_largest_micro_batch_under_the_limit_and_caches_it(tmp_path):
    limit = peak_at(300)
    net = model()
    before = copy.deepcopy(net.state_dict())
    opt = torch.optim.Adam(net.parameters())
    s = elastic.init(1024, "auto", model=net, loss_fn=torch.nn.functional.cross_entropy, sample=sample(),
                     optimizer=opt, memory_limit=limit, cache=tmp_path / "probe.json")
    assert 270 <= s.max_micro_batch <= 300 and peak_at(s.max_micro_batch) <= limit
    assert s.steps == -(-1024 // s.max_micro_batch) and elastic.max_micro_batch_of is not None
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), before.values()))
    assert opt.state_dict()["state"] == {}  # probing trained nothing
    assert (tmp_path / "probe.json").exists()
    again = elastic.init(1024, max_micro_batch="auto", model=net, loss_fn=torch.nn.functional.cross_entropy,
                         sample=sample(), optimizer=opt, memory_limit=limit, cache=tmp_path / "probe.json")
    assert again.max_micro_batch == s.max_micro_batch


def test_auto_names_what_it_needs():
    with pytest.raises(ElasticInitError, match=r'init\(G, "auto"\) probes the micro-batch size and needs '
                                                r"model, loss_fn, sample="):
        elastic.init(256, "auto")
    with pytest.raises(ElasticInitError, match=r"memory_limit"):
        elastic.init(256, "auto", model=model(), loss_fn=torch.nn.functional.cross_entropy, sample=sample(),
                     memory_limit="lots")
    with pytest.raises(ElasticInitError, match=r'init\(G, "auto"\): .*'):
        elastic.init(256, "auto", model=model(), loss_fn=torch.nn.functional.cross_entropy, sample=sample(),
                     memory_limit=1000)  # not even one sample fits


def test_two_ranks_agree_on_the_smallest_probe(tmp_path):
    small, large = peak_at(100), peak_at(400)
    ranks = run_two_ranks(tmp_path, "elastic/autosize_rank.py", str(small), str(large))
    assert ranks[0]["max_micro_batch"] == ranks[1]["max_micro_batch"] <= 100
    assert ranks[0]["probed_alone"] <= 100 < ranks[1]["probed_alone"]
