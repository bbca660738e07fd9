"""Any float dtype: float64, bfloat16, float16 and mixed models train under AllReduce.

One flat gradient buffer per dtype (never a cast), a step equal to plain PyTorch's in the
same dtype, a real 2-process gloo reduction equal to one process, and checkpoints that
keep every dtype.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dtype_cases import KINDS, G, Net, accumulate, backend, data, loss
from flextrain.elastic.statecodec import decode, encode
from flextrain.worker.pytorch import TorchBackend
from flextrain.worker.module import ModelDefError

HERE = Path(__file__).resolve().parent
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_one_buffer_per_dtype_in_a_fixed_order_and_the_slots_end_the_first():
    class Many(nn.Module):
        def __init__(self):
            super().__init__()
            self.f16 = nn.Parameter(torch.zeros(5, dtype=torch.float16))
            self.f64 = nn.Parameter(torch.zeros(2, 3, dtype=torch.float64))
            self.bf16 = nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
            self.f32 = nn.Parameter(torch.zeros(7))
            self.more_f64 = nn.Parameter(torch.zeros(1, dtype=torch.float64))
            self.frozen = nn.Parameter(torch.zeros(9), requires_grad=False)
            self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))

    b = TorchBackend(model_def=SimpleNamespace(path="m.py"), model=Many(), optimizer=None, extra=3)
    assert [(t.dtype, t.numel()) for t in b.buffers] == [
        (torch.float32, 7 + 3), (torch.float64, 6 + 1), (torch.bfloat16, 4), (torch.float16, 5)]
    assert b.size == 7 + 7 + 4 + 5 and b.slots.data_ptr() == b.buffers[0][7:].data_ptr()

    only_bf16 = nn.Linear(2, 2).bfloat16()
    b = TorchBackend(model_def=SimpleNamespace(path="m.py"), model=only_bf16, optimizer=None, extra=3)
    assert [(t.dtype, t.numel()) for t in b.buffers] == [(torch.bfloat16, 6 + 3)]  # the slots ride in bfloat16
    b = TorchBackend(model_def=SimpleNamespace(path="m.py"), model=nn.Module(), optimizer=None, extra=3)
    assert [(t.dtype, t.numel()) for t in b.buffers] == [(torch.float32, 3)]  # nothing to train: slots only


def test_a_parameter_of_another_dtype_is_refused_naming_it():
    model = nn.Linear(2, 2)
    model.phase = nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ModelDefError, match=r"m\.py: parameter 'phase' is torch.complex64; trainable parameters "
                                            r"must be float32, float64, bfloat16 or float16"):
        TorchBackend(model_def=SimpleNamespace(path="m.py"), model=model, optimizer=None, extra=3)


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_equals_a_plain_pytorch_step_in_the_same_dtype(kind):
    """Alone (no copies) and gathered (gradients in the buffers, as before a reduction), one step of
    uneven micro-batches is bit for bit the plain loop's; the dtypes stay what the model has."""
    x, y = data()
    reference = Net(kind)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):  # two steps: the momentum buffers count too
        opt.zero_grad()
        for lo, hi in ((0, 3), (3, 6), (6, 8), (8, 10)):
            (loss(y[lo:hi], reference(x[lo:hi])) * ((hi - lo) / G)).backward()
        opt.step()
    want = params(reference)
    for gather in (False, True):
        b = backend(kind)
        for _ in range(2):
            b.zero()
            for rank in (0, 1):
                accumulate(b, x, y, rank=rank, world=2)
            if gather:
                b.gathered()
                assert {p.grad.dtype for p in b.params} == {t.dtype for t in b.buffers}
            b.apply()
        got = params(b.model)
        for name, value in want.items():
            assert got[name].dtype == value.dtype, name
            assert torch.equal(got[name], value), (name, gather)
        assert b.model.calls.dtype == torch.int64 and b.model.frozen.eq(1).all()


def test_uneven_splits_are_exact_in_float64():
    """size/G scaling: four micro-batches of 3/3/2/2 give the gradient of the mean over all 10."""
    x, y = data()
    b = backend("float64")
    b.zero()
    for rank in (0, 1):
        accumulate(b, x, y, rank=rank, world=2)
    b.gathered()
    whole = Net("float64")
    grads = torch.autograd.grad(loss(y, whole(x)), [p for p in whole.parameters() if p.requires_grad])
    for p, want in zip(b.params, grads):
        torch.testing.assert_close(p.grad, want, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("adam", [False, True])
def test_checkpoints_keep_every_dtype_and_the_next_step_is_the_same(adam):
    x, y = data()
    veteran, newcomer = backend("mixed", adam=adam), backend("mixed", adam=adam)
    newcomer.model.head.bias.data.fill_(5.0)  # different until the state is loaded

    def step(b):
        b.zero()
        accumulate(b, x, y, rank=0, world=1)
        b.apply()

    step(veteran)
    state = veteran.state()
    tree = decode(encode(state))  # what a checkpoint or a newcomer's broadcast carries
    flat_before = {k: v for k, v in _tensors(state)}
    flat_after = dict(_tensors(tree))
    assert flat_before.keys() == flat_after.keys()
    assert {str(v.dtype) for v in flat_after.values()} >= {"torch.float32", "torch.float64", "torch.int64"}
    for key, value in flat_before.items():
        assert flat_after[key].dtype == value.dtype and torch.equal(flat_after[key], value), key
    newcomer.load_state(tree)
    for b in (veteran, newcomer):
        step(b)
    for (name, a), b in zip(params(veteran.model).items(), params(newcomer.model).values()):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def _tensors(tree, prefix=""):
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _tensors(v, f"{prefix}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _tensors(v, f"{prefix}/{i}")


def test_two_gloo_processes_reduce_each_dtype_like_one_process(tmp_path):
    """Two real processes, each its half of the step, reduce every per-dtype buffer in its own dtype:
    the reduced buffer is exactly the sum of the two (no cast on the way), the control slots are
    summed too, and the model after the step is the one-process model's."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    procs = [subprocess.Popen([sys.executable, str(HERE / "dtype_cases.py"), "127.0.0.1", str(store.port),
                               str(rank), str(tmp_path / f"rank-{rank}")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    ranks = [decode((tmp_path / f"rank-{r}").read_bytes()) for r in (0, 1)]
    x, y = data()
    for kind in KINDS:
        zero, one = ranks[0][kind], ranks[1][kind]
        alone = backend(kind)
        assert [t.dtype for t in zero["reduced"]] == [t.dtype for t in alone.buffers], kind
        size = alone.size - sum(t.numel() for t in alone.buffers[1:])  # gradients in the first buffer
        for i, (a, b) in enumerate(zip(zero["local"], one["local"])):
            grads = slice(0, size) if i == 0 else slice(None)
            assert torch.equal(zero["reduced"][i][grads], a[grads] + b[grads]), (kind, i)
            assert torch.equal(one["reduced"][i], zero["reduced"][i]), (kind, i)
        assert zero["reduced"][0][size:].tolist() == [1.0, 1.0, 0.0]  # each rank raised one flag
        alone.zero()
        for rank in (0, 1):
            accumulate(alone, x, y, rank=rank, world=2)
        alone.apply()
        for name, want in params(alone.model).items():
            for r in ranks:
                got = r[kind]["model"][name]
                assert got.dtype == want.dtype, (kind, name)
                tol = TOLERANCE[want.dtype]
                torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=f"{kind} {name}")
