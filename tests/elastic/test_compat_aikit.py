"""`flextrain.compat.aikit`: AIkit's names over flextrain's init, plan and GA wrapper."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from flextrain.compat import aikit
from flextrain.elastic.session import ElasticInitError, Session, activate
from flextrain.elastic.world import World, WorldSource
from ga_model import data, full_batch_reference, loss, model


def test_values_are_none_before_init_and_the_plan_after(fresh_init, monkeypatch):
    assert (aikit.elastic.steps, aikit.elastic.batch_size, aikit.elastic.gpus, aikit.elastic.master) == (None,) * 4
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    aikit.elastic.Torch.init(256, 64)
    assert (aikit.elastic.steps, aikit.elastic.batch_size, aikit.elastic.global_batch_size) == (2, 64, 256)
    assert (aikit.elastic.gpus, aikit.elastic.master) == (2, False)


def test_values_follow_whichever_framework_initialised_last(fresh_init):
    aikit.elastic.Torch.init(256, 64)
    assert aikit.elastic.steps == 4
    # What flextrain.elastic.keras.init does last: activate its Session (here: 4 replicas).
    keras_plan = Session.plan_for(256, 64, World(processes=1, rank=0, devices_per_process=4,
                                                 source=WorldSource.LOCAL_DEVICES))
    activate(keras_plan)
    assert (aikit.elastic.steps, aikit.elastic.batch_size, aikit.elastic.gpus) == (1, 256, 4)
    aikit.elastic.Torch.init(256, 64)
    assert aikit.elastic.steps == 4


def test_the_ga_optimizer_sums_like_aikit(fresh_init):
    aikit.elastic.Torch.init(256, 64)
    net = model()
    optimizer = aikit.ga.Torch.optim.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), aikit.elastic.steps)
    x, y = data(256)
    for j in range(4):
        loss(net, x[64 * j:64 * (j + 1)], y[64 * j:64 * (j + 1)]).backward()
        optimizer.step()
        optimizer.zero_grad()
    reference = full_batch_reference(256, 1, lambda p: torch.optim.SGD(p, lr=0.4))  # 4 means summed
    for p, r in zip(net.parameters(), reference, strict=True):
        torch.testing.assert_close(p.detach(), r, rtol=1e-12, atol=1e-12)
    with pytest.raises(ElasticInitError, match="steps=3 disagrees"):
        aikit.ga.Torch.optim.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 3)


def test_the_torch_path_never_imports_tensorflow():
    code = ("import sys; from flextrain.compat import aikit; aikit.elastic.Torch.init(256, 64); "
            "assert aikit.elastic.steps == 4; print('tensorflow' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_tf_names_are_flextrain_elastic_keras(fresh_init):
    keras = pytest.importorskip("flextrain.elastic.keras", reason="flextrain.elastic.keras not merged yet")
    assert aikit.elastic.TF.model.Model is keras.Model and aikit.elastic.models.Model is keras.Model
    aikit.elastic.TF.init(256, 64)
    assert aikit.elastic.global_batch_size == 256 and aikit.elastic.steps == keras.steps
