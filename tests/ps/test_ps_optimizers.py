"""PS optimizers against torch.optim: dense tensors, the flat-arena path, and sparse row updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flextrain.ps.dense import DenseStore, Spec
from flextrain.ps.embedding import EmbeddingTable, TableSpec
from flextrain.ps.optimizers import OPTIMIZERS, make_optimizer

# (PS name, PS hyperparameters, torch class, torch kwargs)
CASES = [
    ("sgd", {"lr": 0.1}, torch.optim.SGD, {"lr": 0.1}),
    ("sgd", {"lr": 0.05, "weight_decay": 0.01}, torch.optim.SGD, {"lr": 0.05, "weight_decay": 0.01}),
    ("momentum", {"lr": 0.05}, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    ("sgd", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3}, torch.optim.SGD,
     {"lr": 0.05, "momentum": 0.8, "dampening": 0.3}),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": 1, "weight_decay": 1e-3}, torch.optim.SGD,
     {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    ("adam", {"lr": 0.01}, torch.optim.Adam, {"lr": 0.01}),
    ("adam", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01, "amsgrad": 1},
     torch.optim.Adam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01, "amsgrad": True}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1}, torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    ("adagrad", {"lr": 0.1}, torch.optim.Adagrad, {"lr": 0.1}),
    ("adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "weight_decay": 0.01},
     torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "weight_decay": 0.01}),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]
STEPS = 6


def _torch_steps(cls, kwargs, start: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    p = torch.nn.Parameter(start.clone())
    opt = cls([p], **kwargs)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


@pytest.mark.parametrize("name,hyper,cls,kwargs", CASES, ids=IDS)
def test_dense_update_matches_torch(name, hyper, cls, kwargs):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(5, 7, generator=gen)
    grads = [torch.randn(5, 7, generator=gen) for _ in range(STEPS)]
    opt = make_optimizer(name, hyper)
    p = start.clone()
    state = {k: torch.full_like(p, v) for k, v in opt.slots().items()}
    for step, g in enumerate(grads, start=1):
        opt.update(p, g, state, step)
    torch.testing.assert_close(p, _torch_steps(cls, kwargs, start, grads), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,hyper,cls,kwargs", CASES[::2] + CASES[5:6], ids=IDS[::2] + IDS[5:6])
def test_dense_store_flat_and_per_tensor_paths_match_torch(name, hyper, cls, kwargs):
    """Several tensors in one arena (flat fast path), then a step where one has no gradient:
    torch skips a parameter whose grad is None, and so must the PS."""
    gen = torch.Generator().manual_seed(1)
    shapes = {"a.weight": (4, 3), "a.bias": (4,), "b.weight": (2, 4), "b.bias": (2,)}
    start = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    store = DenseStore([Spec(n, "float32", s) for n, s in shapes.items()])
    for n, t in start.items():
        store.params.views[n].copy_(t)
    params = {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}
    ref = cls(params.values(), **kwargs)
    opt = make_optimizer(name, hyper)
    for step in range(STEPS):
        absent = {"b.bias"} if step in (2, 3) else set()
        grads = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
        buf = store.wrap(bytearray(store.total_bytes))
        for n, g in grads.items():
            buf.views[n].copy_(g)
        store.apply(opt, buf, absent)
        for n, p in params.items():
            p.grad = None if n in absent else grads[n].clone()
        ref.step()
    for n, p in params.items():
        torch.testing.assert_close(store.params.views[n], p.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,hyper,cls,kwargs", CASES, ids=IDS)
def test_sparse_rows_update_like_dense_and_untouched_rows_stay(name, hyper, cls, kwargs):
    """Rows pushed at every step follow the dense optimizer on a tensor of those rows; a row pushed
    at some steps only follows it over just those steps (lazy state); other rows never change."""
    dim, gen = 6, torch.Generator().manual_seed(2)
    table = EmbeddingTable(TableSpec("emb", dim, initializer="normal", seed=3))
    opt = make_optimizer(name, hyper)
    always, sometimes, never = np.array([5, 17, 2**40]), np.array([99]), np.array([7, 8])
    initial = table.gather(np.concatenate([always, sometimes, never]))
    grads_always, grads_sometimes = [], []
    for step in range(STEPS):
        ids, g = always, torch.randn(len(always), dim, generator=gen)
        grads_always.append(g)
        if step % 2:
            gs = torch.randn(1, dim, generator=gen)
            grads_sometimes.append(gs)
            ids, g = np.concatenate([always, sometimes]), torch.cat([g, gs])
        table.apply(opt, ids, g)
    after = table.gather(np.concatenate([always, sometimes, never]))
    torch.testing.assert_close(after[:3], _torch_steps(cls, kwargs, initial[:3], grads_always), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after[3:4], _torch_steps(cls, kwargs, initial[3:4], grads_sometimes),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(after[4:], initial[4:])


def test_staleness_lr_scale_scales_the_step():
    opt = make_optimizer("sgd", {"lr": 0.1})
    p = torch.zeros(3)
    opt.update(p, torch.ones(3), {}, 1, lr_scale=0.5)
    torch.testing.assert_close(p, torch.full((3,), -0.05))


def test_unknown_optimizer_is_a_clear_error():
    with pytest.raises(ValueError) as err:
        make_optimizer("rmsprop-ish", {"lr": 0.1})
    message = str(err.value)
    assert "rmsprop-ish" in message
    for known in OPTIMIZERS:
        assert known in message


def test_unknown_or_bad_hyperparameters_are_clear_errors():
    with pytest.raises(ValueError, match=r"'adam' has no hyperparameter\(s\) momentum; it takes: .*beta1"):
        make_optimizer("adam", {"momentum": 0.9})
    with pytest.raises(ValueError, match="beta2 must be in"):
        make_optimizer("adam", {"beta2": 1.0})
    with pytest.raises(ValueError, match="lr must be a number >= 0"):
        make_optimizer("sgd", {"lr": -1})
    with pytest.raises(ValueError, match="nesterov needs momentum"):
        make_optimizer("sgd", {"nesterov": 1})


@pytest.mark.parametrize("name,hyper,cls,kwargs", CASES, ids=IDS)
def test_config_taken_from_a_torch_optimizer_reproduces_it(name, hyper, cls, kwargs):
    from flextrain.protocol.codec import torch_optimizer_config

    gen = torch.Generator().manual_seed(4)
    start = torch.randn(9, generator=gen)
    grads = [torch.randn(9, generator=gen) for _ in range(STEPS)]
    ps_name, ps_hyper = torch_optimizer_config(cls([torch.nn.Parameter(start.clone())], **kwargs))
    opt = make_optimizer(ps_name, ps_hyper)
    p = start.clone()
    state = {k: torch.full_like(p, v) for k, v in opt.slots().items()}
    for step, g in enumerate(grads, start=1):
        opt.update(p, g, state, step)
    torch.testing.assert_close(p, _torch_steps(cls, kwargs, start, grads), rtol=1e-6, atol=1e-7)


def test_torch_optimizers_the_ps_cannot_run_are_refused():
    from flextrain.protocol.codec import torch_optimizer_config

    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="cannot run RMSprop; it runs torch.optim.SGD"):
        torch_optimizer_config(torch.optim.RMSprop(params))
    with pytest.raises(ValueError, match="maximize"):
        torch_optimizer_config(torch.optim.SGD(params, lr=0.1, maximize=True))
    two = torch.optim.SGD([{"params": params, "lr": 0.1}, {"params": [torch.nn.Parameter(torch.zeros(1))]}], lr=0.2)
    with pytest.raises(ValueError, match=r"differ in \['lr'\]"):
        torch_optimizer_config(two)
