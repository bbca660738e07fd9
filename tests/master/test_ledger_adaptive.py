"""The ledger under ``--batch-schedule adaptive``: G decided at decision points from the noise scale
(rounded to a multiple of the min, clamped to the bounds), runs never crossing an undecided point,
exactly-once over epochs while G changes, and decisions that survive a persist/restore."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from flextrain.data import Shard
from flextrain.master.adaptive_batches import AdaptiveSchedule
from flextrain.master.ledger import LedgerStateError, TaskLedger

SHARDS = [Shard("a.rio", 0, 203), Shard("b.rio", 0, 97)]


def make(*, noise, every=None, epochs=3, **overrides) -> TaskLedger:
    schedule = AdaptiveSchedule(min_global_batch=4, max_global_batch=30, every=every, noise_scale=noise)
    kwargs = dict(shards=SHARDS, epochs=epochs, global_batch_size=4, steps_per_task=3, schedule=schedule,
                  max_retries=10**6, renew_ids=True)
    return TaskLedger(**{**kwargs, **overrides})


@pytest.mark.parametrize("scale, want", [(None, 4), (0.5, 4), (5.9, 4), (6.1, 8), (9.9, 8), (10.1, 12),
                                         (27.0, 28), (29.0, 28), (31.0, 30), (1e9, 30), (float("inf"), 30),
                                         (float("nan"), 4)])
def test_a_decision_rounds_the_noise_scale_to_a_multiple_of_the_min_within_the_bounds(scale, want):
    schedule = AdaptiveSchedule(min_global_batch=4, max_global_batch=30, every=5, noise_scale=lambda: scale)
    assert schedule.hand_out(0, epoch=0, max_steps=8) == (4, 5)  # step 0 is the min; the run stops at step 5
    assert schedule.hand_out(5, epoch=0, max_steps=8) == (want, 5)
    assert schedule.history == [(0, 4), (5, want)]


def test_per_epoch_decisions_at_each_epochs_first_hand_out():
    holder = {}
    # what the workers measured over the epoch before (asked when the next epoch's tasks are cut)
    ledger = holder["ledger"] = make(noise=lambda: {1: 7.0, 2: 17.0}.get(holder["ledger"].epoch))
    by_epoch: dict[int, set] = {}
    while (task := ledger.next_training_task("round-0")) is not None:
        by_epoch.setdefault(task.epoch, set()).add(task.global_batch_size)
        ledger.complete(task.task_id)
    assert by_epoch == {0: {4}, 1: {8}, 2: {16}}
    assert [g for _, g in ledger.schedule.history] == [4, 8, 16]
    assert ledger.schedule.history[1][0] == 76  # epoch 0: 51 + 25 steps of 4 (each shard ends short)
    assert ledger.records_done == 900


@pytest.mark.parametrize("seed", range(6))
def test_exactly_once_while_g_changes_every_n_steps_under_interruptions_and_failures(seed):
    rng = random.Random(seed)
    scale = {"value": None}
    ledger = make(noise=lambda: scale["value"], every=5, shuffle=seed % 2 == 1, seed=seed)
    seen: Counter = Counter()
    version = 0
    steps_g = {}  # global step -> the G it ran with
    while not ledger.training_finished():
        ledger.next_step = version  # a round forms at the model's version (rounds.settle)
        while (task := ledger.next_training_task("round")) is not None:
            scale["value"] = rng.uniform(0, 40)  # the workers' estimate moves on
            assert task.global_batch_size in range(4, 29, 4) or task.global_batch_size == 30
            roll, k = rng.random(), rng.randrange(task.steps)
            run = k if roll < 0.3 else task.steps
            for j in range(run):
                assert ledger.schedule.global_batch(version) == task.global_batch_size  # decided, never revised
                steps_g.setdefault(version, task.global_batch_size)
                assert steps_g[version] == task.global_batch_size
                lo = task.start + j * task.global_batch_size
                for record in range(lo, min(task.end, lo + task.global_batch_size)):
                    seen[(task.epoch, task.source, record)] += 1
                version += 1
            if roll < 0.15:
                ledger.interrupt(task.task_id, k)
                break
            if roll < 0.3:
                ledger.fail(task.task_id, k, "bad record")
                continue
            ledger.complete(task.task_id)
    want = {(e, s.source, r) for e in range(3) for s in SHARDS for r in range(s.start, s.end)}
    assert set(seen) == want and set(seen.values()) == {1}
    assert ledger.records_done == ledger.records_total == 900
    history = ledger.schedule.history
    assert all(s % 5 == 0 for s, _ in history) and len({g for _, g in history}) > 2  # G changed at points only


def test_decisions_persist_with_the_ledger_and_a_restored_job_goes_on_with_its_last_g():
    ledger = make(noise=lambda: 13.0, every=3)
    for _ in range(3):
        ledger.complete(ledger.next_training_task("round-0").task_id)
    state = ledger.to_dict()
    assert state["schedule"]["history"] == [[0, 4], [3, 12], [6, 12]]
    fresh = make(noise=lambda: None, every=3)
    fresh.restore(state)
    fresh.next_step = 9
    task = fresh.next_training_task("round-0")
    assert task.global_batch_size == 12 and fresh.schedule.history[-1] == (9, 12)  # no estimate yet: G holds
    assert fresh.schedule.global_batch(4) == 12 and fresh.schedule.global_batch(2) == 4
    # an older ledger file without decisions starts afresh; a malformed history is refused, naming it
    fresh.restore({k: v for k, v in state.items() if k != "schedule"})
    assert fresh.schedule.history == [(0, 4)]
    with pytest.raises(LedgerStateError, match="schedule: batch history"):
        fresh.check_state({**state, "schedule": {"history": [[0, 4], [3, 64]], "epoch": 0}})
