"""flextrain.elastic.progress: what a script reports, and what its agent reads back for the heartbeat."""

from __future__ import annotations

import json
import math

import pytest
import torch

from flextrain.elastic import progress
from flextrain.elastic.progress import ENV_PROGRESS_FILE, ProgressReader


def test_outside_a_job_reporting_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_PROGRESS_FILE, raising=False)
    monkeypatch.chdir(tmp_path)
    progress.report_loss(torch.tensor(1.0))
    progress.report(step=1, loss=2.0, samples=4)
    assert not progress.active() and list(tmp_path.iterdir()) == []


def test_the_agent_reads_each_step_once_with_the_mean_loss(monkeypatch, tmp_path):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(path))
    reader = ProgressReader(path)
    assert reader.take()[0] is None  # nothing reported yet
    progress.report_loss(torch.tensor(1.0))
    progress.report_loss(torch.tensor(3.0))
    progress.report(step=1, samples=8)  # the mean of the losses given since the last report
    progress.report(step=2, loss=4.0, samples=8)
    loss, samples, step = reader.take()
    assert (loss, samples, step) == (3.0, 16, 2)
    assert reader.take()[1:] == (0, 0)  # read once
    with open(path, "a") as f:
        f.write('{"step": 3, "samples": 8')  # a line still being written: left for the next take
    assert reader.take()[1:] == (0, 0)
    with open(path, "a") as f:
        f.write(', "loss": "nan"}\n')
    loss, samples, step = reader.take()
    assert math.isnan(loss) and (samples, step) == (8, 3)


def test_the_ga_optimizer_reports_each_real_step(fresh_init, monkeypatch, tmp_path):
    import flextrain.elastic.torch as elastic

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(path))
    model = torch.nn.Linear(2, 1)
    optimizer = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), steps=2)
    for loss_value in (1.0, 2.0, 3.0, 4.0):  # two real steps of two micro-steps
        loss = model(torch.ones(1, 2)).sum() * 0 + loss_value
        optimizer.scale(loss).backward()
        optimizer.step()
        optimizer.zero_grad()
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    loss, _, step = ProgressReader(path).take()
    assert step == 2 and loss == (1.5 + 3.5) / 2


def test_auto_accelerate_reports_each_step_with_its_loss(fresh_init, monkeypatch, tmp_path):
    from flextrain.accelerate import auto_accelerate

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(path))
    data = [(torch.full((2,), float(i)), torch.tensor([float(i)])) for i in range(8)]
    ok, result, _ = auto_accelerate(torch.nn.Linear(2, 1), torch.optim.SGD, data,
                                    lambda batch, out: torch.nn.functional.mse_loss(out, batch[1]),
                                    optim_args={"lr": 0.01}, dataloader_args={"batch_size": 4},
                                    load_strategy=[], prepare_input=lambda b, d: b,
                                    model_input_format=None)
    assert ok
    losses = []
    for batch in result.dataloader:
        loss = result.loss_func(batch, result.model(batch[0]))
        losses.append(float(loss.detach()))
        loss.backward()
        result.optim.step()
        result.optim.zero_grad()
    records = [line for line in path.read_text().splitlines()]
    assert len(records) == 2  # 8 samples, global batch 4
    loss, samples, step = ProgressReader(path).take()
    assert (samples, step) == (8, 2) and loss == pytest.approx(sum(losses) / 2)


def test_a_keras_models_fit_reports_each_update(fresh_init, monkeypatch, tmp_path):
    pytest.importorskip("tensorflow")
    import numpy as np

    from flextrain.elastic import keras as elastic_keras
    from flextrain.elastic.session import ATTRIBUTES

    for name in ATTRIBUTES:  # the Keras API's own copy of init's plan: none yet
        monkeypatch.setattr(elastic_keras, name, None)
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(path))
    keras = elastic_keras.keras
    inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model = elastic_keras.Model(inner, steps=2)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(np.ones((8, 2), "float32"), np.ones((8, 1), "float32"), batch_size=2, epochs=1, verbose=0)
    reader = ProgressReader(path)
    loss, _, step = reader.take()
    assert step == 2 and math.isfinite(loss)  # 4 micro-batches of 2: 2 updates
    model.fit(np.ones((8, 2), "float32"), np.ones((8, 1), "float32"), batch_size=2, epochs=1, verbose=0)
    assert reader.take()[2] == 4  # a second fit (one per epoch, say) goes on counting


def test_a_real_step_reports_every_sample_of_its_micro_batches(fresh_init, monkeypatch, tmp_path):
    """init(64, 16) in one process: 4 micro-steps of 16 make a step of 64 samples (was counted as 16)."""
    elastic = fresh_init
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(path))
    elastic.init(64, 16)
    model = torch.nn.Linear(2, 1)
    optimizer = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2 * elastic.steps):  # two real steps
        optimizer.scale(model(torch.ones(elastic.batch_size, 2)).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    _, samples, step = ProgressReader(path).take()
    assert (step, samples) == (2, 2 * 64)


@pytest.mark.parametrize("bad", ["abc", None, True, torch.ones(3)], ids=["str", "None", "bool", "vector"])
def test_report_loss_refuses_what_is_not_one_loss_at_the_call(monkeypatch, tmp_path, bad):
    """In or out of a job: a TypeError where the script passed it (it surfaced later, inside flextrain)."""
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(tmp_path / "progress.jsonl"))
    with pytest.raises(TypeError, match="report_loss takes a loss: a number or a one-element tensor, got"):
        progress.report_loss(bad)
    for good in (1.0, 2, torch.tensor(3.0), torch.tensor([4.0])):
        progress.report_loss(good)
    progress.report(step=1, samples=1)
    assert ProgressReader(tmp_path / "progress.jsonl").take()[0] == 2.5


def test_a_restarted_script_continues_the_step_count_from_its_commit(fresh_init, monkeypatch, tmp_path):
    """The examples commit the inner optimizer (not the wrapper, whose real-step count restarts at 0):
    the step reported with the commit comes back with State.restore, and the count goes on from it."""
    import flextrain.elastic.torch as elastic
    from flextrain.elastic.state import State

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(path))

    def start():  # what a script does at each start
        model = torch.nn.Linear(2, 1)
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        state = State(directory=tmp_path / "state", model=model, optimizer=inner, step=0)
        state.restore()
        return elastic.Optimizer(inner, steps=1), state

    optimizer, state = start()
    for _ in range(3):
        optimizer.scale(torch.ones((), requires_grad=True)).backward()
        optimizer.step()
        state.step += 1
        if state.step == 2:
            state.commit()
    reader = ProgressReader(path)
    assert reader.take()[2] == 3
    monkeypatch.setattr(progress, "_restored_step", 0)  # a new process
    optimizer, state = start()
    assert state.step == 2
    optimizer.scale(torch.ones((), requires_grad=True)).backward()
    optimizer.step()
    assert reader.take()[2] == 3  # step 3 again (the one after the commit), not 1


def test_a_wrapper_restored_with_its_own_count_is_not_counted_twice(fresh_init, monkeypatch, tmp_path):
    import flextrain.elastic.torch as elastic
    from flextrain.elastic.state import State

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_PROGRESS_FILE, str(path))
    model = torch.nn.Linear(2, 1)
    optimizer = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), steps=1)
    state = State(directory=tmp_path / "state", model=model, optimizer=optimizer)
    for _ in range(4):
        optimizer.scale(model(torch.ones(1, 2)).sum()).backward()
        optimizer.step()
    state.commit()
    model = torch.nn.Linear(2, 1)
    optimizer = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), steps=1)
    State(directory=tmp_path / "state", model=model, optimizer=optimizer).restore()
    optimizer.scale(model(torch.ones(1, 2)).sum()).backward()
    optimizer.step()
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
