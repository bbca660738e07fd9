"""Rule optimizers over a TraceBatchSampler: equal to full-batch steps with the rule's LR, in one
process and in 2 real gloo processes; AdaScale's gain; checkpoints mid-trace."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import trace_train as tt
from flextrain.elastic.torch import AdaScaleOptimizer, LinearRuleOptimizer, TraceBatchSampler
from ft_helpers import run_two_ranks



def assert_params(actual, expected, tol=1e-12):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), e, rtol=tol, atol=tol)


@pytest.mark.parametrize("rule", ["linear", "sqrt"])
def test_one_process_equals_full_batch_steps_with_the_rules_lr(rule):
    net, opt = tt.train(rule)
    # 2 epochs: steps 0-5 (5 partial: 1 sample) and 6-10 (10 partial: 5 samples)
    assert opt.real_steps == 11 and opt.last_step == 10 and opt.last_batch == 5
    assert opt.param_groups[0]["lr"] == tt.LR, "the base LR is kept: scaling never compounds"
    assert opt.last_lr[0] == pytest.approx(tt.LR * (5 / 8 if rule == "linear" else (5 / 8) ** 0.5))
    assert_params(list(net.parameters()), tt.reference(rule))
    other = tt.reference("sqrt" if rule == "linear" else "linear")
    assert not all(torch.allclose(p, q) for p, q in zip(net.parameters(), other)), "the rule matters"


def run_rule_ranks(tmp_path: Path, rule: str) -> list[dict]:
    return run_two_ranks(tmp_path, "elastic/trace_train.py", rule)


@pytest.mark.parametrize("rule", ["linear", "sqrt", "adascale"])
def test_two_gloo_processes_equal_one_process(tmp_path, rule):
    """Rank 1 has no share of epoch 0's last (1-sample) step and joins its all-reduce anyway."""
    ranks = run_rule_ranks(tmp_path, rule)
    net, opt = tt.train(rule)
    expected = tt.reference(rule) if rule != "adascale" else [p.detach() for p in net.parameters()]
    for result in ranks:
        assert result["real_steps"] == 11
        assert_params(result["params"], expected, tol=1e-10)
        if rule == "adascale":  # the statistics are global: the same gain as in one process
            assert result["gain"] == pytest.approx(opt.gain, rel=1e-9)
            assert result["progress"] == pytest.approx(opt.progress, rel=1e-9)


@pytest.mark.parametrize("rule", ["linear", "adascale"])
@pytest.mark.parametrize("stop", [(0, 3), (1, 4)])  # mid-step (step 1, 2nd of 4), a step boundary mid-epoch 1
def test_a_checkpoint_mid_trace_continues_identically(rule, stop):
    whole, _ = tt.train(rule, epochs=3)
    net, sampler, opt = tt.setup(rule, 1, 0)
    tt.run_epochs(net, sampler, opt, 3, stop=stop)
    saved = copy.deepcopy({"model": net.state_dict(), "optimizer": opt.state_dict()})
    assert saved["optimizer"]["accumulated"] is not None
    net, sampler, opt = tt.setup(rule, 1, 0)  # a fresh process
    net.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    tt.run_epochs(net, sampler, opt, 3, first=opt.epoch, start=opt.minibatch)
    assert_params(list(net.parameters()), [p.detach() for p in whole.parameters()], tol=0)


def noisy_regression(noise: float, samples: int = 4096):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(samples, 4, generator=g, dtype=torch.float64)
    w = torch.tensor([[1.0], [-2.0], [0.5], [1.5]], dtype=torch.float64)
    return x, x @ w + noise * torch.randn(samples, 1, generator=g, dtype=torch.float64)


def adascale_gain(batch: int, noise: float, ref: int = 8, minibatch: int = 4) -> AdaScaleOptimizer:
    x, y = noisy_regression(noise)
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1, bias=False).double()
    torch.nn.init.zeros_(net.weight)
    sampler = TraceBatchSampler(len(x), batch, 1, 0, minibatch_size=minibatch, seed=0)
    opt = AdaScaleOptimizer(torch.optim.SGD(net.parameters(), lr=1e-4), sampler, ref_batchsize=ref)
    gains = []
    for index in sampler:
        torch.nn.functional.mse_loss(net(x[index]), y[index]).backward()
        if opt.step():
            gains.append(opt.gain)
            assert opt.last_lr[0] == pytest.approx(1e-4 * opt.gain)
    assert opt.progress == pytest.approx(sum(gains))
    return opt


def test_adascale_gain_is_one_at_the_reference_batch_and_grows_with_noise_and_batch():
    assert adascale_gain(8, noise=30.0).gain == pytest.approx(1.0)
    noisy = [adascale_gain(b, noise=30.0).gain for b in (32, 128)]
    clean = adascale_gain(128, noise=0.0).gain
    assert 1.0 < noisy[0] < noisy[1] <= 128 / 8
    assert noisy[1] > 8, f"large label noise: the gain nears the batch ratio 16, got {noisy[1]}"
    assert 1.0 <= clean < 2.5, f"no label noise, far from the optimum: the gain stays small, got {clean}"


def test_zero_grad_is_a_no_op_and_the_sampler_epoch_must_match():
    net = torch.nn.Linear(2, 1)
    sampler = TraceBatchSampler(8, 4, 1, 0, minibatch_size=2)
    opt = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, 4)
    net(torch.ones(2, 2)).sum().backward()
    opt.step()
    grad = net.weight.grad.clone()
    opt.zero_grad()
    assert torch.equal(net.weight.grad, grad), "accumulating: zero_grad must not clear"
    opt.set_epoch(0)
    sampler.set_epoch(1)
    opt2 = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, 4)
    opt2.set_epoch(0)
    with pytest.raises(ValueError, match="sampler is at epoch 1 but the optimizer at epoch 0"):
        opt2.step()


def test_log_steps_logs_step_batch_lr_and_gain(caplog):
    net = torch.nn.Linear(2, 1).double()
    sampler = TraceBatchSampler(48, [8, 16], 1, 0, minibatch_size=4)
    opt = AdaScaleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, 8, log_steps=2)
    x = torch.randn(48, 2, dtype=torch.float64)
    with caplog.at_level("INFO", logger="flextrain.elastic.rules"):
        for index in sampler:
            net(x[index]).pow(2).mean().backward()
            opt.step()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(",")[0] for line in lines] == ["AdaScaleOptimizer: step 0", "AdaScaleOptimizer: step 2"]
    assert lines[0].startswith("AdaScaleOptimizer: step 0, global batch 8, lr 0.1, gain 1,")
    assert lines[1].startswith("AdaScaleOptimizer: step 2, global batch 16, lr ")
