"""Each optimization method changes what it should, on one CPU process (2-process ones: test_two_processes.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from accel_models import AttnNet, Block, BlockNet, ConvNet, NaiveSelfAttention, SDPASelfAttention, mse
from flextrain.accelerate import Inputs, UnavailableMethodError, apply_strategy, register_replace_pair
from flextrain.accelerate.methods.precision import AmpOptimizer
from flextrain.accelerate.patches import patches_of
from flextrain.elastic.world import World, WorldSource

ONE = World(processes=1, rank=0, devices_per_process=1, source=WorldSource.LOCAL_DEVICES)


def inputs(model, **kw):
    kw.setdefault("optim_func", torch.optim.SGD)
    kw.setdefault("optim_args", {"lr": 0.1})
    kw.setdefault("loss_func", lambda batch, out: F.mse_loss(out.float(), batch[1].float()))
    return Inputs.checked(model, **kw)


def apply(strategy, model, **kw):
    return apply_strategy(strategy, inputs(model, **kw), world=ONE, device="cpu").result


def batch(n=8, d=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, 1, generator=g)


def step(result, data):
    data = result.prepare_input(data, "cpu")
    loss = result.loss_func(data, result.model(data[0]))
    loss.backward()
    result.optim.step()
    result.optim.zero_grad()
    return loss


def test_amp_bf16_runs_forward_and_loss_under_autocast():
    seen = []
    r = apply([("amp_native", "bf16")], BlockNet())
    r.model.blocks[0].fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    loss = step(r, batch())
    assert seen == [torch.bfloat16] and loss.dtype == torch.float32  # mse_loss autocasts to fp32
    assert not isinstance(r.optim, AmpOptimizer)  # bf16: no scaler, no wrapper
    assert isinstance(patches_of(r.model)[0].dtype, torch.dtype)
    with torch.no_grad():  # the patched forward is the model's: plain calls are autocast too
        assert r.model(batch()[0]).dtype == torch.bfloat16


def test_amp_fp16_scales_the_backward_and_unscales_in_the_step():
    torch.manual_seed(0)
    base = BlockNet()
    r = apply([("amp_native", "fp16")], copy.deepcopy(base))
    assert isinstance(r.optim, AmpOptimizer) and r.optim.grad_scaler is not None
    x, y = batch()
    data = r.prepare_input((x, y), "cpu")
    loss = r.loss_func(data, r.model(data[0]))
    with torch.autocast("cpu", dtype=torch.float16):
        plain = F.mse_loss(base(x).float(), y)
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)  # the loss keeps its true value
    loss.backward()
    plain.backward()
    scale = r.optim.grad_scaler.get_scale()
    assert scale > 1
    torch.testing.assert_close(r.model.out.weight.grad, base.out.weight.grad * scale, rtol=1e-3, atol=1e-3)
    r.optim.step()  # unscaled: the same SGD step as the plain model's
    with torch.no_grad():
        for p in base.parameters():
            p -= 0.1 * p.grad
    torch.testing.assert_close(r.model.out.weight, base.out.weight, rtol=1e-3, atol=1e-4)
    assert not r.optim.step_was_skipped


def test_amp_skips_steps_with_nonfinite_gradients():
    for config in ({"dtype": "fp16"}, {"dtype": "bf16", "skip_if_nonfinite": True}):
        r = apply([("amp_native", config)], BlockNet(),
                  loss_func=lambda b, out: (out * torch.tensor(float("inf"))).mean())
        before = [p.detach().clone() for p in r.model.parameters()]
        step(r, batch())
        assert r.optim.step_was_skipped, config
        assert all(torch.equal(a, b) for a, b in zip(before, r.model.parameters()))


def test_half_casts_weights_and_inputs():
    r = apply([("half", "bf16")], BlockNet())
    assert {p.dtype for p in r.model.parameters()} == {torch.bfloat16}
    x, y = r.prepare_input(batch(), "cpu")
    assert x.dtype == y.dtype == torch.bfloat16
    assert r.prepare_input({"x": torch.ones(2), "ids": torch.ones(2, dtype=torch.long)}, "cpu")["ids"].dtype == torch.long
    step(r, batch())


def test_channels_last_for_weights_inputs_and_activations():
    r = apply(["channels_last"], ConvNet(), loss_func=lambda b, out: out.float().pow(2).mean())
    assert r.model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = r.prepare_input((torch.randn(2, 3, 8, 8),), "cpu")[0]
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    r.model(x)
    assert r.model.seen.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(UnavailableMethodError, match="no 2-D convolution"):
        apply(["channels_last"], BlockNet())


@pytest.mark.parametrize("no_reentrant", [True, False])
def test_checkpointed_modules_recompute_and_give_the_same_gradients(no_reentrant):
    torch.manual_seed(0)
    base = BlockNet(blocks=3)
    r = apply([("checkpoint", {"wrap_class": (Block,), "no_reentrant": no_reentrant})], copy.deepcopy(base))
    x, y = batch()
    x.requires_grad_(not no_reentrant)  # the reentrant variant needs an input that requires grad
    Block.calls = 0
    mse((x, y), base(x)).backward()
    assert Block.calls == 3
    Block.calls = 0
    mse((x, y), r.model(x)).backward()
    assert Block.calls == 6  # each checkpointed block runs again in the backward pass
    for a, b in zip(base.parameters(), r.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    Block.calls = 0
    with torch.no_grad():
        r.model(x)
    assert Block.calls == 3
    assert list(r.model.state_dict()) == list(base.state_dict())


def test_checkpoint_by_class_name_with_a_limit_and_a_clear_refusal():
    r = apply([("checkpoint", {"wrap_class": "Block", "max_checkpoint_module_num": 2})], BlockNet(blocks=3))
    assert [bool(patches_of(b)) for b in r.model.blocks] == [True, True, False]
    with pytest.raises(UnavailableMethodError, match="no module of class Conv2d"):
        apply([("checkpoint", (torch.nn.Conv2d,))], BlockNet())


def test_compile_returns_a_compiled_module_with_the_same_outputs():
    torch.manual_seed(0)
    base = BlockNet()
    r = apply(["compile"], copy.deepcopy(base))
    assert isinstance(r.model, torch._dynamo.eval_frame.OptimizedModule)
    x = batch()[0]
    with torch.no_grad():
        torch.testing.assert_close(r.model(x), base(x), rtol=1e-5, atol=1e-5)
    plain = apply([], copy.deepcopy(base), optim_args={"lr": 0.02})
    r.optim.param_groups[0]["lr"] = 0.02
    losses = [step(r, batch(seed=1)).item() for _ in range(3)]
    assert losses == pytest.approx([step(plain, batch(seed=1)).item() for _ in range(3)], rel=1e-4)
    assert losses[-1] < losses[0]


def test_module_replace_swaps_attention_and_keeps_outputs_and_weights():
    register_replace_pair("test_naive_attention_sdpa", pair_cls=(NaiveSelfAttention, SDPASelfAttention))
    torch.manual_seed(0)
    base = AttnNet().eval()
    r = apply(["module_replace"], copy.deepcopy(base), loss_func=lambda b, out: out.pow(2).mean())
    model = r.model
    assert type(model.mha).__name__ == "SDPAMultiheadAttention" and isinstance(model.naive, SDPASelfAttention)
    assert model.state_dict().keys() == base.state_dict().keys()
    assert model.mha.in_proj_weight is not base.mha.in_proj_weight
    x = torch.randn(4, 10, 16)
    torch.testing.assert_close(model(x), base(x), rtol=1e-5, atol=1e-6)
    out, weights = model.mha(x, x, x)
    assert weights is None
    torch.testing.assert_close(out, base.mha(x, x, x)[0], rtol=1e-5, atol=1e-6)
    # only some pairs, by name
    only = apply([("module_replace", ["MultiheadAttention_SDPA"])], AttnNet(), loss_func=lambda b, o: o.mean()).model
    assert type(only.mha).__name__ == "SDPAMultiheadAttention" and type(only.naive) is NaiveSelfAttention
    with pytest.raises(UnavailableMethodError, match="no module that a registered replacement pair replaces"):
        apply(["module_replace"], BlockNet())


def test_methods_that_cannot_apply_here_say_why_or_are_skipped():
    for name, reason in (("tf32", "CUDA tensor-core format"), ("fsdp", "needs a data-parallel world"),
                         ("zero1", "needs a data-parallel world"), ("fsdp2", "needs a data-parallel world"),
                         ("zero2", "needs a data-parallel world")):
        with pytest.raises(UnavailableMethodError, match=reason):
            apply([name], BlockNet())
    two = World(processes=2, rank=0, devices_per_process=1, source=WorldSource.ENVIRONMENT)
    from flextrain.accelerate import get
    assert "needs a CUDA device" in get("fsdp").check(BlockNet(), torch.device("cpu"), two)
    applied = apply_strategy(["parallel_mode", "auto_ddp", "fsdp", ("amp_native", "bf16")], inputs(BlockNet()),
                             world=ONE, device="cpu", skip_unavailable=True)
    assert applied.report.strategy.names == ("parallel_mode", "auto_ddp", "amp_native")
    assert [s.name for s in applied.report.skipped] == ["fsdp"]
    assert "a world of one process, no DDP wrapper" in " ".join(applied.report.notes)
    assert applied.report.strategy.config("parallel_mode") == ([("data", 1)], None)
    assert isinstance(applied.result.model, BlockNet)
