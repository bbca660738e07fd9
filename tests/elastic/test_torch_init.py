"""`flextrain.elastic.torch.init(G, M)`: the module attributes a script reads, for each world."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from flextrain.elastic.session import ATTRIBUTES, ElasticInitError, current

PY_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


@pytest.mark.parametrize("processes, steps, batch_sizes", [
    (1, 4, (64, 64, 64, 64)), (2, 2, (64, 64)), (3, 2, (43, 43)), (4, 1, (64,)),
])
def test_the_seed_table_through_init(fresh_init, monkeypatch, processes, steps, batch_sizes):
    elastic = fresh_init
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    monkeypatch.setenv("RANK", "0")
    returned = elastic.init(256, 64)
    assert (elastic.steps, elastic.batch_sizes, elastic.batch_size) == (steps, batch_sizes, batch_sizes[0])
    assert (elastic.global_batch_size, elastic.gpus, elastic.world_size) == (256, processes, processes)
    assert (elastic.rank, elastic.master, elastic.device_batch_size) == (0, True, batch_sizes[0])
    assert elastic.loss_weights == tuple(n * processes / 256 for n in batch_sizes)
    assert elastic.session is returned and current() is returned


def test_a_second_init_after_the_world_changed_recomputes_everything(fresh_init, monkeypatch):
    elastic = fresh_init
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    elastic.init(256, max_micro_batch=64)
    assert (elastic.steps, elastic.world_size, elastic.rank, elastic.master) == (1, 4, 3, False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # two workers left; this one is rank 1 now
    monkeypatch.setenv("RANK", "1")
    elastic.init(256, max_micro_batch=64)
    assert (elastic.steps, elastic.world_size, elastic.gpus, elastic.rank, elastic.master) == (2, 2, 2, 1, False)
    assert elastic.session.world.processes == 2 and current() is elastic.session


def test_only_rank_0_logs_the_plan(fresh_init, monkeypatch, caplog):
    elastic = fresh_init
    caplog.set_level(logging.INFO, logger="flextrain.elastic.torch")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    elastic.init(256, 64)
    assert caplog.records == []
    monkeypatch.setenv("RANK", "0")
    s = elastic.init(256, 64)
    assert [r.getMessage() for r in caplog.records] == [f"flextrain.elastic.torch: {s.describe()}"]


@pytest.mark.parametrize("args, kwargs, named", [
    ((256,), {}, "pass max_gpu_batch_size (positional, AIkit's name) or max_micro_batch="),
    ((256, 64), {"max_micro_batch": 64}, "init got both max_gpu_batch_size=64 and max_micro_batch=64"),
    ((256, "64"), {}, "max_micro_batch (max_gpu_batch_size) must be a positive integer, got '64' (str)"),
    ((0,), {"max_micro_batch": 8}, "global_batch_size must be a positive integer, got 0"),
])
def test_bad_init_arguments_name_the_argument(fresh_init, args, kwargs, named):
    elastic = fresh_init
    with pytest.raises(ElasticInitError) as info:
        elastic.init(*args, **kwargs)
    assert named in str(info.value)
    assert elastic.steps is None and current() is None  # a refused init publishes nothing


def test_before_init_every_attribute_is_none():
    """In a fresh interpreter, as a script sees the module right after importing it."""
    code = ("import json, flextrain.elastic.torch as e; from flextrain.elastic.session import ATTRIBUTES; "
            "print(json.dumps({n: getattr(e, n) for n in ATTRIBUTES}))")
    env = {k: v for k, v in PY_ENV.items() if k not in ("WORLD_SIZE", "RANK")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == dict.fromkeys(ATTRIBUTES)
