"""--lr-rule adascale in a job worker: the backend's per-micro-batch measurement is exactly
Σ n_i‖g_i‖² of explicitly computed micro-batch gradients (float64), the rule's gain is what
GradientNoise gives for them, the LR is base × gain (exactly base at G == ref), and the
estimates travel with the state broadcast and checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextrain.data.digits import write_digits
from flextrain.elastic.noise import GradientNoise
from flextrain.elastic.planner import plan_step
from flextrain.elastic.statecodec import decode
from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.adascale import AdaScaleRule
from flextrain.worker.collective import Collective
from flextrain.worker.module import load_model_def
from flextrain.worker.pytorch import TorchBackend
from flextrain.worker.trainer import AllReduceTrainer, WorkerState
from ft_helpers import MODEL_ZOO, FakeMaster

DIGITS = f"{MODEL_ZOO / 'digits_torch.py'}:Model"


class Awkward(nn.Module):
    """What a per-parameter hook must get right: a weight used twice in one forward (its gradient
    is the sum of both uses), a sparse embedding hit by repeated ids, a parameter with no gradient."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 4)
        self.emb = nn.Embedding(7, 4, sparse=True)
        self.tied = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.spare = nn.Parameter(torch.ones(3))
        self.double()

    def forward(self, features):
        h = torch.relu(self.inp(features["x"]) + self.emb(features["ids"]))
        return self.head(self.tied(torch.tanh(self.tied(h))))


def _loss(labels, predictions):
    return nn.functional.mse_loss(predictions, labels)


def _backend(model, lr=0.1):
    model_def = type("Def", (), {"path": "test", "loss": staticmethod(_loss)})()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return TorchBackend(model_def=model_def, model=model, optimizer=opt, extra=4), opt


def _explicit(model, features, labels, plan):
    """(Σ n_i‖g_i‖², ‖ḡ‖²) from each micro-batch's mean-loss gradient, computed on its own."""
    params = [p for p in model.parameters()]
    weighted, total = 0.0, [torch.zeros_like(p) for p in params]
    for offset, size in plan.slices(0):
        sl = slice(offset, offset + size)
        out = model({k: v[sl] for k, v in features.items()})
        grads = torch.autograd.grad(_loss(labels[sl], out), params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g.to_dense() for p, g in zip(params, grads)]
        weighted += size * sum(float(g.pow(2).sum()) for g in grads)
        for t, g in zip(total, grads):
            t.add_(g, alpha=size / plan.global_batch)
    return weighted, sum(float(t.pow(2).sum()) for t in total)


@pytest.mark.parametrize("reduced", [False, True])
def test_the_measurement_is_exact_and_the_gain_is_gradient_noises(reduced):
    torch.manual_seed(0)
    model = Awkward()
    plan = plan_step(11, 1, 3)  # micro-batches of 3, 3, 3 and 2 samples
    rule, noise = AdaScaleRule(reference=4, smoothing=0.5), GradientNoise(smoothing=0.5)
    backend, opt = _backend(model)
    shadow = copy.deepcopy(model)  # the explicit gradients, computed without the backend's hooks
    backend.measure_micro_batches()
    gains = []
    for step in range(3):
        x, ids, y = torch.randn(11, 5, dtype=torch.float64), torch.randint(0, 3, (11,)), torch.randn(11, 2, dtype=torch.float64)
        features = {"x": x, "ids": ids}
        shadow.load_state_dict(model.state_dict())
        weighted, mean_sqr = _explicit(shadow, features, y, plan)
        backend.zero()
        for offset, size in plan.slices(0):
            backend.accumulate(features, y, slice(offset, offset + size), scale=size / plan.global_batch)
        assert float(backend.micro_sqr) == pytest.approx(weighted, rel=1e-12)
        if reduced:  # as before an all-reduce: the gradients move into the flat buffers
            backend.gathered()
        assert backend.grad_sqr() == pytest.approx(mean_sqr, rel=1e-12)
        rule.reduced(backend)
        gain = rule.set_lr(backend, plan)
        assert noise.observe(micro_batches=4, samples=11, weighted_sqr=weighted, mean_sqr=mean_sqr)
        assert gain == pytest.approx(noise.gain(11, 4), rel=1e-9)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * gain, rel=1e-15)
        gains.append(gain)
        backend.apply()
    assert all(1.0 < g <= 11 / 4 for g in gains), gains  # noisy gradients: above 1, at most G/ref
    assert rule.noise_scale == pytest.approx(noise.noise_scale, rel=1e-9)
    assert rule.noise.gain(11, 11) == 1.0  # at G == ref exactly 1, whatever the estimates


class Master(FakeMaster):
    def __init__(self, tasks):
        super().__init__(tasks)
        self.checkpoints = []

    def report_checkpoint(self, path, position, **kw):
        self.checkpoints.append(path)


def _trainer(tmp_path, **settings):
    spec = JobSpec.of(name="j", model_def=DIGITS, training_data=str(tmp_path), job_dir=str(tmp_path / "job"),
                      lr_rule="adascale", max_micro_batch=8, learning_rate=0.1, **settings).validate()
    model_def = load_model_def(DIGITS)
    model = model_def.build_model()
    return AllReduceTrainer(spec=spec, model_def=model_def, model=model,
                            optimizer=model_def.build_optimizer(model, 0.1), client=Master([]),
                            collective=Collective(), state=WorkerState())


def _lrs(trainer):
    return [g["lr"] for g in trainer.optimizer.param_groups]


def test_the_estimates_travel_with_the_state_and_checkpoints_and_the_lr_is_base_times_gain(tmp_path):
    write_digits(tmp_path / "digits")
    source = str(sorted((tmp_path / "digits" / "train").iterdir())[0])
    trainer = _trainer(tmp_path, global_batch_size=32, reference_batch_size=16)
    try:
        task = pb.Task(task_id=0, source=source, start=0, end=160, global_batch_size=32)  # 5 steps of 4 micro-batches
        assert trainer.run_task(task) is None
    finally:
        trainer.loader.close()
    rule, state = trainer.adascale, trainer.state
    assert state.version == 5 and rule.noise.variance is not None
    assert 1.0 < rule.gain <= 2.0 and state.lr_factor == rule.gain and state.noise_scale == rule.noise_scale
    assert _lrs(trainer) == [0.1 * rule.gain]

    newcomer = _trainer(tmp_path, global_batch_size=32, reference_batch_size=16)  # a member joining the round
    newcomer.load_blob(trainer.state_blob())
    assert newcomer.adascale.state() == rule.state() and newcomer.state.version == 5

    path = trainer.checkpoint()
    assert decode(path.read_bytes())["adascale"] == rule.state()

    # Resumed at G == ref: the gain is exactly 1 (the estimates go on from the checkpoint's).
    resumed = _trainer(tmp_path, global_batch_size=16, reference_batch_size=16)
    resumed.load_blob(path.read_bytes())
    weight = resumed.adascale.noise.state_dict()["ema"]["weight"]
    try:
        task = pb.Task(task_id=1, source=source, start=160, end=224, global_batch_size=16)  # 4 steps of 2
        assert resumed.run_task(task) is None
    finally:
        resumed.loader.close()
    assert resumed.adascale.noise.state_dict()["ema"]["weight"] > weight  # observed on top of the loaded
    assert resumed.state.lr_factor == 1.0 and _lrs(resumed) == [0.1]
