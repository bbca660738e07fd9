"""The plan `init(G, M)` computes, for every kind of world: the seed's table, uneven splits, bad input."""

from __future__ import annotations

import pytest

from flextrain.elastic.session import ElasticInitError, Session
from flextrain.elastic.world import World, WorldSource, from_environment


def world(processes: int, rank: int = 0, devices: int = 1) -> World:
    return World(processes=processes, rank=rank, devices_per_process=devices, source=WorldSource.ENVIRONMENT)


@pytest.mark.parametrize("processes, steps, batch", [(1, 4, 64), (2, 2, 64), (4, 1, 64)])
def test_the_seed_table(processes, steps, batch):
    s = Session.plan_for(256, 64, world(processes))
    assert (s.steps, s.batch_size, s.global_batch_size, s.world_size, s.even) == (steps, batch, 256, processes, True)
    assert s.loss_weights == (1 / steps,) * steps
    assert s.batch_size * s.steps * s.world_size == 256


def test_three_processes_keep_g_and_stay_under_m():
    """runai 0.4.1: batch 85 > M and a global batch of 255. Here: G=256 exactly, no micro-batch above 64."""
    sessions = [Session.plan_for(256, 64, world(3, rank=r)) for r in range(3)]
    assert {s.steps for s in sessions} == {2}
    assert sum(sum(s.batch_sizes) for s in sessions) == 256
    assert all(max(s.batch_sizes) <= 64 for s in sessions) and not sessions[0].even
    assert sessions[0].batch_sizes == (43, 43) and sessions[2].batch_sizes == (42, 42)
    # The weights make the DDP-averaged, accumulated gradient the mean over G: sum_j w_j * n_j-mean = G-mean.
    for s in sessions:
        assert s.loss_weights == tuple(n * 3 / 256 for n in s.batch_sizes)
    assert sum(w * n / 3 for s in sessions for w, n in zip(s.loss_weights, s.batch_sizes)) == \
        pytest.approx(sum(n * n / 256 for s in sessions for n in s.batch_sizes))


def test_data_parallel_loader_gets_every_devices_share():
    """One process driving 2 devices: the loader's batch is both devices' micro-batches (128), not 64."""
    s = Session.plan_for(256, 64, World(processes=1, rank=0, devices_per_process=2,
                                        source=WorldSource.LOCAL_DEVICES))
    assert (s.steps, s.batch_size, s.device_batch_size, s.world_size) == (2, 128, 64, 2)
    assert s.loss_weights == (0.5, 0.5)


@pytest.mark.parametrize("G, M, named", [
    (0, 64, "global_batch_size must be a positive integer, got 0"),
    (-5, 64, "global_batch_size must be a positive integer, got -5"),
    (256, 0, "max_micro_batch (max_gpu_batch_size) must be a positive integer, got 0"),
    (256.0, 64, "global_batch_size must be a positive integer, got 256.0 (float)"),
    (True, 64, "global_batch_size must be a positive integer, got True (bool)"),
    ("256", 64, "global_batch_size must be a positive integer, got '256' (str)"),
    (3, 64, "global_batch_size (3) is smaller than the data-parallel width (4"),
])
def test_bad_arguments_name_the_argument(G, M, named):
    with pytest.raises(ElasticInitError) as info:
        Session.plan_for(G, M, world(4))
    assert named in str(info.value)


@pytest.mark.parametrize("env, problem", [
    ({"WORLD_SIZE": "2"}, "RANK is not"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE='two' is not an integer"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "the rank must lie in [0, WORLD_SIZE)"),
])
def test_a_broken_launcher_environment_is_named(env, problem):
    with pytest.raises(ValueError) as info:
        from_environment(env)
    assert problem in str(info.value)


def test_the_environment_gives_the_world():
    assert from_environment({}) is None
    w = from_environment({"WORLD_SIZE": "3", "RANK": "2"})
    assert (w.size, w.rank, w.master, w.source) == (3, 2, False, WorldSource.ENVIRONMENT)


def test_activate_makes_the_latest_plan_current():
    from flextrain.elastic import session as sessions

    first, second = Session.plan_for(256, 64, world(1)), Session.plan_for(256, 64, world(2))
    assert sessions.activate(first) is first and sessions.current() is first
    sessions.activate(second)
    assert sessions.current() is second and sessions.current().steps == 2
    with pytest.raises(TypeError, match="activate takes a Session, got dict"):
        sessions.activate({"steps": 4})
    assert sessions.current() is second
