"""flextrain.elastic.keras.init: the seed's table from the launcher's environment, re-planning, bad arguments."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

import flextrain.elastic.keras as elastic  # noqa: E402
from flextrain.elastic import session as sessions  # noqa: E402
from flextrain.elastic.session import ElasticInitError  # noqa: E402


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in ("steps", "batch_size", "session", "gpus", "world_size", "rank", "master"):
        monkeypatch.setattr(elastic, name, None)
    monkeypatch.setattr(sessions, "_current", None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)


@pytest.mark.parametrize("processes, steps", [(1, 4), (2, 2), (4, 1)])
def test_the_seed_table(monkeypatch, processes, steps):
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    monkeypatch.setenv("RANK", str(processes - 1))
    s = elastic.init(256, 64)
    assert (elastic.steps, elastic.batch_size, elastic.global_batch_size, elastic.gpus, elastic.world_size) == \
        (steps, 64, 256, processes, processes)
    assert (elastic.rank, elastic.master) == (processes - 1, processes == 1)
    assert elastic.batch_sizes == (64,) * steps and elastic.device_batch_size == 64
    assert elastic.loss_weights == (1 / steps,) * steps
    assert elastic.session is s and sessions.current() is s


def test_without_a_launcher_the_world_is_the_strategys_replicas():
    s = elastic.init(256, max_micro_batch=64)  # CPU, default strategy: one replica
    assert (s.world_size, s.steps, s.batch_size, s.world.source.value) == (1, 4, 64, "local-devices")


def test_init_again_replans_for_the_new_world(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    first = elastic.init(256, 64)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    second = elastic.init(256, 64)
    assert (first.steps, second.steps) == (4, 2)
    assert (elastic.steps, elastic.batch_sizes, elastic.gpus, elastic.rank) == (2, (42, 42), 3, 2)
    assert elastic.session is second and sessions.current() is second


@pytest.mark.parametrize("args, kwargs, named", [
    ((256,), {}, "pass max_gpu_batch_size (positional, AIkit's name) or max_micro_batch="),
    ((256, 64), {"max_micro_batch": 32}, "got both max_gpu_batch_size=64 and max_micro_batch=32"),
    ((0, 64), {}, "global_batch_size must be a positive integer, got 0"),
    ((256, "64"), {}, "max_micro_batch (max_gpu_batch_size) must be a positive integer, got '64'"),
])
def test_bad_arguments_name_the_argument(args, kwargs, named):
    with pytest.raises(ElasticInitError) as info:
        elastic.init(*args, **kwargs)
    assert named in str(info.value)
    assert elastic.session is None  # nothing half-published
