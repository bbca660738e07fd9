"""The GA wrapper in one process: equal to full-batch training, in place over the inner optimizer."""

from __future__ import annotations

import copy

import pytest
import torch

from ga_model import data, full_batch_reference, loss, model
from flextrain.elastic.session import ElasticInitError


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def train_wrapped(elastic, G: int, real_steps: int, make_optimizer, *, steps=None, sizes=None, after_step=None):
    """Micro-batches of this process's plan (``batch_sizes``) over consecutive global batches."""
    net = model()
    inner = make_optimizer(net.parameters())
    opt = elastic.Optimizer(inner, steps)
    x, y = data(G * real_steps)
    sizes = sizes or elastic.batch_sizes
    offset = 0
    for _ in range(real_steps):
        for n in sizes:
            loss(net, x[offset:offset + n], y[offset:offset + n]).backward()
            offset += n
            opt.step()
            opt.zero_grad()
            if after_step:
                after_step(opt)
    assert offset == G * real_steps and opt.real_steps == real_steps
    return net, opt, inner


def assert_same(params, reference, tol=1e-12):
    for p, r in zip(params, reference, strict=True):
        torch.testing.assert_close(p.detach(), r, rtol=tol, atol=tol)


def test_even_split_equals_full_batch_sgd(fresh_init):
    elastic = fresh_init
    elastic.init(256, 64)
    assert elastic.steps == 4
    net, _, _ = train_wrapped(elastic, 256, 3, sgd)
    assert_same(net.parameters(), full_batch_reference(256, 3, sgd))


def test_uneven_split_is_exact_with_the_loss_weights(fresh_init):
    elastic = fresh_init
    elastic.init(250, 64)
    assert (elastic.steps, elastic.batch_sizes) == (4, (63, 63, 62, 62))
    net, _, _ = train_wrapped(elastic, 250, 3, sgd)
    assert_same(net.parameters(), full_batch_reference(250, 3, sgd))


def test_equal_weights_would_not_pass_the_uneven_check(fresh_init):
    """The tolerance above is tight enough to reject 1/steps weights on a 63/63/62/62 split."""
    elastic = fresh_init
    net, _, _ = train_wrapped(elastic, 250, 1, sgd, steps=4, sizes=(63, 63, 62, 62))  # no init: equal weights
    with pytest.raises(AssertionError):
        assert_same(net.parameters(), full_batch_reference(250, 1, sgd))


def test_wrapped_adam_keeps_its_state_and_equals_unwrapped_adam(fresh_init):
    elastic = fresh_init
    elastic.init(256, 64)
    net, opt, inner = train_wrapped(elastic, 256, 3, adam)
    assert opt.optimizer is inner and opt.state is inner.state and opt.param_groups is inner.param_groups
    assert opt.defaults is inner.defaults
    moments = [inner.state[p]["exp_avg"] for p in net.parameters()]
    assert all(m.abs().sum() > 0 for m in moments) and int(inner.state[next(net.parameters())]["step"]) == 3
    assert_same(net.parameters(), full_batch_reference(256, 3, adam))


def test_reduction_sum_applies_the_plain_sum_like_runai(fresh_init):
    elastic = fresh_init
    elastic.init(256, 64)
    net = model()
    opt = elastic.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), reduction="sum")
    x, y = data(256)
    for j in range(4):
        loss(net, x[64 * j:64 * (j + 1)], y[64 * j:64 * (j + 1)]).backward()
        opt.step()
        opt.zero_grad()
    # Sum of 4 micro-batch means = 4x the full-batch mean gradient: like lr 0.4 on the full batch.
    assert_same(net.parameters(), full_batch_reference(256, 1, lambda p: torch.optim.SGD(p, lr=0.4)))


def test_zero_grad_and_step_between_micro_steps(fresh_init):
    elastic = fresh_init
    net = model()
    opt = elastic.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), steps=2)  # without init: allowed
    before = [p.detach().clone() for p in net.parameters()]
    x, y = data(8)
    loss(net, x[:4], y[:4]).backward()
    grad = net[0].weight.grad.clone()
    assert opt.is_boundary is False and opt.step() is None and opt.stepped is False
    opt.zero_grad()
    assert torch.equal(net[0].weight.grad, grad)  # kept: a no-op between micro-steps
    assert_same(net.parameters(), before, tol=0)  # no update yet
    loss(net, x[4:], y[4:]).backward()
    assert opt.is_boundary is True
    opt.step()
    assert opt.stepped is True and not torch.equal(net[0].weight, before[0])
    opt.zero_grad()
    assert net[0].weight.grad is None


def test_a_scheduler_steps_once_per_real_update(fresh_init):
    elastic = fresh_init
    elastic.init(256, 64)
    lrs = []
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=1.0)
    opt = elastic.Optimizer(inner)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # attached to the wrapper

    def after_step(o):
        lrs.append(o.param_groups[0]["lr"])
        if o.stepped:
            scheduler.step()

    x, y = data(256 * 3)
    for j in range(12):
        loss(net, x[64 * j:64 * (j + 1)], y[64 * j:64 * (j + 1)]).backward()
        opt.step()
        opt.zero_grad()
        after_step(opt)
    assert lrs == [1.0] * 4 + [0.5] * 4 + [0.25] * 4 and scheduler.last_epoch == 3
    assert inner.param_groups[0]["lr"] == 0.125  # the inner optimizer's groups are the wrapper's


def test_state_dict_round_trip_in_the_middle_of_an_accumulation(fresh_init):
    elastic = fresh_init
    elastic.init(250, 64)  # uneven: the saved gradients are in the wrapper's units
    x, y = data(500)
    sizes = elastic.batch_sizes
    bounds = [sum(sizes[:j]) for j in range(len(sizes) + 1)] + [250 + sum(sizes[:j + 1]) for j in range(4)]

    def micro(net, opt, j):
        loss(net, x[bounds[j]:bounds[j + 1]], y[bounds[j]:bounds[j + 1]]).backward()
        opt.step()
        opt.zero_grad()

    net = model()
    opt = elastic.Optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    for j in range(6):  # one real step, then 2 micro-steps into the second
        micro(net, opt, j)
    saved_model, saved_opt = copy.deepcopy(net.state_dict()), copy.deepcopy(opt.state_dict())
    assert saved_opt["accumulation"]["position"] == 2 and saved_opt["accumulation"]["steps"] == 4
    for j in range(6, 8):
        micro(net, opt, j)

    resumed = model(seed=7)  # different weights: everything comes from the checkpoint
    resumed.load_state_dict(saved_model)
    opt2 = elastic.Optimizer(torch.optim.Adam(resumed.parameters(), lr=0.01))
    opt2.load_state_dict(saved_opt)
    assert opt2.real_steps == 1 and opt2.is_boundary is False
    for j in range(6, 8):
        micro(resumed, opt2, j)
    assert opt2.real_steps == 2
    assert_same(resumed.parameters(), [p.detach() for p in net.parameters()])
    assert_same(net.parameters(), full_batch_reference(250, 2, adam))


def test_resuming_mid_accumulation_in_another_plan_is_refused(fresh_init, monkeypatch):
    elastic = fresh_init
    elastic.init(256, 64)
    net = model()
    opt = elastic.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    x, y = data(64)
    loss(net, x, y).backward()
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    elastic.init(256, 64)  # the world grew: steps 4 -> 2
    with pytest.raises(ElasticInitError, match=r"accumulation of steps=4, but the current plan has steps=2"):
        elastic.Optimizer(torch.optim.SGD(model().parameters(), lr=0.1)).load_state_dict(saved)


def test_a_disagreeing_steps_names_both_values(fresh_init):
    elastic = fresh_init
    elastic.init(256, 64)
    with pytest.raises(ElasticInitError) as info:
        elastic.Optimizer(torch.optim.SGD(model().parameters(), lr=0.1), 2)
    assert "steps=2 disagrees with init's plan for this world: steps=4" in str(info.value)
    assert elastic.Optimizer(torch.optim.SGD(model().parameters(), lr=0.1), 4).steps == 4


@pytest.mark.parametrize("kwargs, error, named", [
    ({"steps": 0}, ElasticInitError, "steps must be a positive integer, got 0"),
    ({"steps": 2.0}, ElasticInitError, "steps must be a positive integer, got 2.0"),
    ({"reduction": "avg"}, ValueError, "reduction must be \"mean\" or \"sum\", got 'avg'"),
])
def test_bad_wrapper_arguments_are_named(fresh_init, kwargs, error, named):
    with pytest.raises(error) as info:
        fresh_init.Optimizer(torch.optim.SGD(model().parameters(), lr=0.1), **kwargs)
    assert named in str(info.value)


def test_without_init_or_steps_the_first_step_says_what_to_do(fresh_init):
    net = model()
    opt = fresh_init.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(ElasticInitError, match=r"call flextrain.elastic.torch.init\(global_batch_size"):
        opt.step()


def test_the_wrapper_follows_a_re_init_at_the_next_real_step(fresh_init, monkeypatch):
    elastic = fresh_init
    elastic.init(256, 64)
    net = model()
    opt = elastic.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), elastic.steps)
    x, y = data(64)
    for _ in range(4):
        loss(net, x, y).backward()
        opt.step()
        opt.zero_grad()
    assert opt.real_steps == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    elastic.init(256, 64)
    assert opt.steps == 2


def test_attributes_pass_through_to_the_inner_optimizer(fresh_init):
    inner = torch.optim.SGD(model().parameters(), lr=0.1, momentum=0.9)
    opt = fresh_init.Optimizer(inner, steps=2)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.defaults["momentum"] == 0.9 and opt._optimizer_step_pre_hooks is inner._optimizer_step_pre_hooks
    with pytest.raises(TypeError, match="already wrapped"):
        fresh_init.Optimizer(opt, steps=2)


def train_loss_weighted(elastic, G: int, real_steps: int, make_optimizer):
    """As train_wrapped, with each micro-step's loss weighted by ``optimizer.scale``."""
    net = model()
    opt = elastic.Optimizer(make_optimizer(net.parameters()))
    x, y = data(G * real_steps)
    offset, sizes = 0, elastic.batch_sizes
    for _ in range(real_steps):
        for n in sizes:
            opt.scale(loss(net, x[offset:offset + n], y[offset:offset + n])).backward()
            offset += n
            opt.step()
            opt.zero_grad()
    assert opt.real_steps == real_steps
    return net, opt


@pytest.mark.parametrize("G", [256, 250])
def test_loss_weighted_by_scale_equals_full_batch_sgd(fresh_init, G):
    elastic = fresh_init
    elastic.init(G, 64)
    net, _ = train_loss_weighted(elastic, G, 3, sgd)
    assert_same(net.parameters(), full_batch_reference(G, 3, sgd))


def test_scale_returns_the_loss_times_the_micro_steps_weight(fresh_init):
    elastic = fresh_init
    elastic.init(250, 64)
    opt = elastic.Optimizer(sgd(model().parameters()))
    one = torch.tensor(1.0, requires_grad=True)
    weights = []
    for _ in range(4):
        weights.append(opt.scale(one * 1.0).item())
        opt.step()
    assert weights == pytest.approx([63 / 250, 63 / 250, 62 / 250, 62 / 250], abs=1e-7)
    summed = elastic.Optimizer(sgd(model().parameters()), reduction="sum")
    assert summed.scale(one * 3.0).item() == 3.0


def test_mixing_scale_and_plain_backward_in_one_accumulation_is_refused(fresh_init):
    elastic = fresh_init
    elastic.init(256, 64)
    net = model()
    x, y = data(256)
    opt = elastic.Optimizer(sgd(net.parameters()))
    loss(net, x[:64], y[:64]).backward()
    opt.step()
    with pytest.raises(RuntimeError, match=r"scale\(loss\) in micro-step 2 of 4.*plain loss"):
        opt.scale(loss(net, x[64:128], y[64:128]))
    opt2 = elastic.Optimizer(sgd(net.parameters()))
    opt2.scale(loss(net, x[:64], y[:64])).backward()
    opt2.step()
    loss(net, x[64:128], y[64:128]).backward()
    with pytest.raises(RuntimeError, match=r"micro-step 2 of 4 did not call optimizer.scale"):
        opt2.step()


def test_a_loss_weighted_accumulation_resumes_from_its_state_dict(fresh_init):
    elastic = fresh_init
    elastic.init(250, 64)
    x, y = data(250)
    net = model()
    opt = elastic.Optimizer(sgd(net.parameters()))
    for n, start in ((63, 0), (63, 63)):
        opt.scale(loss(net, x[start:start + n], y[start:start + n])).backward()
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    assert saved["accumulation"]["loss_weighted"] is True
    resumed_net = copy.deepcopy(net)
    resumed = elastic.Optimizer(sgd(resumed_net.parameters()))
    resumed.load_state_dict(saved)
    for n, start in ((62, 126), (62, 188)):
        resumed.scale(loss(resumed_net, x[start:start + n], y[start:start + n])).backward()
        resumed.step()
    assert resumed.stepped
    assert_same(resumed_net.parameters(), full_batch_reference(250, 1, sgd))


def test_a_world_of_processes_without_a_process_group_is_refused_at_the_first_real_step(fresh_init, monkeypatch):
    """WORLD_SIZE=2 from the launcher, no init_process_group: each process would apply its own half of G
    (two replicas drifting apart, the job 'Succeeded')."""
    elastic = fresh_init
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    elastic.init(8, 2)
    model = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ElasticInitError, match="2 processes .* but torch.distributed has no process group"):
        for _ in range(elastic.steps):
            optimizer.scale(model(torch.ones(elastic.batch_size, 2)).sum()).backward()
            optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
