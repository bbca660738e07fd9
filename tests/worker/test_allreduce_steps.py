"""AllReduceTrainer's step loop, in process (a world of one needs no process group):
records are read ahead once, gradients are not zeroed into a buffer nobody reduces."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from flextrain.data.digits import write_digits
from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.pytorch import TorchBackend
from flextrain.worker.collective import Collective
from flextrain.worker.module import load_model_def
from flextrain.worker.trainer import AllReduceTrainer, WorkerState
from ft_helpers import MODEL_ZOO, FakeMaster

DIGITS = f"{MODEL_ZOO / 'digits_torch.py'}:Model"


@pytest.mark.parametrize("read_ahead", ["1", "0"])
def test_every_step_is_loaded_exactly_once(tmp_path, monkeypatch, read_ahead):
    """With a read-ahead thread, every step after a task's first is loaded while the one before
    computes; without (the cores are taken), each on the spot. The same loads either way."""
    monkeypatch.setenv("FLEXTRAIN_READ_AHEAD", read_ahead)
    write_digits(tmp_path / "digits")
    source = str(sorted((tmp_path / "digits" / "train").iterdir())[0])
    spec = JobSpec.of(name="j", model_def=DIGITS, training_data=source, job_dir=str(tmp_path / "job"),
                   global_batch_size=32).validate()
    model_def = load_model_def(DIGITS)
    model = model_def.build_model()
    trainer = AllReduceTrainer(spec=spec, model_def=model_def, model=model,
                               optimizer=model_def.build_optimizer(model, 0.1), client=FakeMaster([]),
                               collective=Collective(), state=WorkerState())
    loads, threads = [], set()
    load = trainer.loader._load

    def counted(task, start, end):
        loads.append((task.task_id, start, end))
        threads.add(threading.current_thread() is threading.main_thread())
        return load(task, start, end)

    trainer.loader._load = counted
    try:
        for task_id, start in ((0, 0), (1, 100)):  # 4 steps: 32, 32, 32 and a short 4
            task = pb.Task(task_id=task_id, source=source, start=start, end=start + 100, global_batch_size=32)
            assert trainer.run_task(task) is None
    finally:
        trainer.loader.close()
    assert sorted(loads) == [(t, s + o, s + min(o + 32, 100)) for t, s in ((0, 0), (1, 100)) for o in (0, 32, 64, 96)]
    if read_ahead == "1":
        assert (trainer.loader.ahead, trainer.loader.now) == (6, 2) and threads == {True, False}
    else:
        assert (trainer.loader.ahead, trainer.loader.now) == (0, 8) and threads == {True}
    assert trainer.state.version == 8


class WithSpare(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.spare = nn.Parameter(torch.ones(4))  # gets no gradient

    def forward(self, x):
        return self.used(x)


def _backend(model):
    model_def = type("Def", (), {"path": "test", "loss": staticmethod(lambda y, p: nn.functional.mse_loss(p, y))})()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return TorchBackend(model_def=model_def, model=model, optimizer=opt, extra=3), opt


def test_gradients_reach_the_buffer_only_when_reduced():
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    lone, _ = _backend(WithSpare())
    reduced, _ = _backend(WithSpare())
    reduced.model.load_state_dict(lone.model.state_dict())
    expected = torch.autograd.grad(nn.functional.mse_loss(lone.model(x), y), list(lone.model.used.parameters()))
    for b in (lone, reduced):
        b.buffers[0].fill_(7.0)  # whatever the buffer held before
        b.zero()
        assert all(p.grad is None for p in b.params) and b.slots.eq(0).all()
        for half in (slice(0, 4), slice(4, 8)):  # two micro-batches of one step
            b.accumulate(x, y, half, scale=0.5)
    assert len(lone.buffers) == 1 and lone.buffers[0][: lone.size].eq(7.0).all()  # alone: nothing copied or zeroed
    reduced.gathered()
    weight, bias = reduced.model.used.weight, reduced.model.used.bias
    for p, want in zip((weight, bias), expected):
        torch.testing.assert_close(p.grad, want)
        assert reduced.buffers[0].untyped_storage().data_ptr() <= p.grad.data_ptr() < reduced.slots.data_ptr()
    assert reduced.model.spare.grad is not None and reduced.model.spare.grad.eq(0).all()
    for b in (lone, reduced):
        b.apply()  # the spare parameter gets a zero gradient either way: same optimizer state
        assert b.model.spare.grad.eq(0).all() and "momentum_buffer" in b.optimizer.state[b.model.spare]
    for a, b in zip(lone.model.parameters(), reduced.model.parameters()):
        torch.testing.assert_close(a, b)


class SparseEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 2, sparse=True)
        self.out = nn.Linear(2, 2)

    def forward(self, ids):
        return self.out(self.emb(ids))


def test_sparse_gradients_are_applied_dense_in_every_world_size():
    """nn.Embedding(sparse=True) with a dense-only optimizer (Adam) trains alike alone or reduced."""
    torch.manual_seed(0)
    ids, y = torch.tensor([0, 1, 1, 3]), torch.randn(4, 2)
    model_def = type("Def", (), {"path": "test", "loss": staticmethod(lambda y, p: nn.functional.mse_loss(p, y))})()
    backends = []
    for _ in range(2):
        model = SparseEmbedding()
        if backends:
            model.load_state_dict(backends[0].model.state_dict())
        backends.append(TorchBackend(model_def=model_def, model=model, extra=3,
                                     optimizer=torch.optim.Adam(model.parameters(), lr=0.1)))
    lone, reduced = backends
    before = lone.model.emb.weight.detach().clone()
    for b in backends:
        b.zero()
        b.accumulate(ids, y, slice(0, 2), scale=0.5)
        b.accumulate(ids, y, slice(2, 4), scale=0.5)
        assert b.model.emb.weight.grad.is_sparse
    reduced.gathered()
    for b in backends:
        b.apply()  # Adam refuses sparse gradients: they must arrive dense
        assert not b.model.emb.weight.grad.is_sparse
    for a, b in zip(lone.model.parameters(), reduced.model.parameters()):
        torch.testing.assert_close(a, b)
    after = lone.model.emb.weight.detach()
    assert not torch.equal(after[0], before[0]) and torch.equal(after[5], before[5])  # looked up / never
