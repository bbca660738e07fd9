"""The methods on a CUDA device (skipped where torch sees none: the ``cuda`` marker, tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from accel_models import Block, BlockNet, TupleModel, mse, regression, train
from flextrain.accelerate import Inputs, auto_accelerate, dry_run, get
from flextrain.accelerate.methods.precision import AmpOptimizer
from flextrain.elastic.world import World, WorldSource

pytestmark = pytest.mark.cuda


def run(strategy, **kw):
    status, result, best = auto_accelerate(TupleModel(BlockNet()), torch.optim.AdamW, regression(), mse,
                                           optim_args={"lr": 0.01}, dataloader_args={"batch_size": 32},
                                           load_strategy=strategy, **kw)
    assert status
    return result, best


def test_model_and_batches_go_to_the_gpu_and_amp_fp16_scales_there():
    result, best = run([("amp_native", "fp16"), ("checkpoint", (Block,))])
    assert next(result.model.parameters()).is_cuda
    assert isinstance(result.optim, AmpOptimizer) and result.optim.grad_scaler is not None
    losses = train(result, epochs=2, device="cuda")
    assert losses[-1] < losses[0]


def test_amp_bf16_on_cuda_autocasts():
    result, best = run([("amp_native", "bf16")])
    seen = []
    result.model.inner.out.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    train(result, epochs=1, device="cuda", limit=1)
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert seen == [expected]


def test_tf32_sets_the_flags_and_a_dry_run_restores_them():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0")
    torch.backends.cuda.matmul.allow_tf32 = False
    inputs = Inputs.checked(TupleModel(BlockNet()), optim_func=torch.optim.SGD, optim_args={"lr": 0.01},
                            dataset=regression(), loss_func=mse, dataloader_args={"batch_size": 32})
    r = dry_run(["tf32"], inputs)
    assert r.ok and r.peak_bytes > 0 and not torch.backends.cuda.matmul.allow_tf32
    run(["tf32"])
    assert torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False


def test_fsdp1_applies_on_cuda_with_more_than_one_process_only():
    one = World(processes=1, rank=0, devices_per_process=1, source=WorldSource.LOCAL_DEVICES)
    two = World(processes=2, rank=0, devices_per_process=1, source=WorldSource.ENVIRONMENT)
    method = get("fsdp")
    assert method.check(BlockNet(), torch.device("cuda", 0), two) is None
    assert "more than one process" in method.check(BlockNet(), torch.device("cuda", 0), one)
