"""The ledger under a batch schedule: each task's steps share the G the trace gives their global steps,
and every record is still trained exactly once per epoch through interruptions and failed tasks."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from flextrain.data import Shard
from flextrain.elastic.schedule import BatchSchedule
from flextrain.master.ledger import TaskLedger

TRACE = BatchSchedule.of_sizes([4, 4, 4, 8, 8, 8, 8, 2, 16, 16, 4, 4, 4, 12])
SHARDS = [Shard("a.rio", 0, 203), Shard("b.rio", 0, 97)]


def make_ledger(**overrides) -> TaskLedger:
    kwargs = dict(shards=SHARDS, epochs=3, global_batch_size=4, steps_per_task=3, schedule=TRACE,
                  max_retries=10**6, renew_ids=True)
    return TaskLedger(**{**kwargs, **overrides})


def test_hand_outs_follow_the_trace_in_runs_of_one_size():
    ledger = make_ledger(epochs=1)
    step, got = 0, []
    while (task := ledger.next_training_task("round-0")) is not None:
        got.append((step, task.global_batch_size, task.steps))
        assert all(TRACE.global_batch(step + j) == task.global_batch_size for j in range(task.steps - 1))
        step += task.steps
        ledger.complete(task.task_id)
    assert got[:6] == [(0, 4, 3), (3, 8, 3), (6, 8, 1), (7, 2, 1), (8, 16, 2), (10, 4, 3)]
    assert ledger.next_step == step and ledger.records_done == 300


def test_a_resumed_round_starts_mid_trace():
    ledger = make_ledger()
    ledger.next_step = 8  # e.g. the round formed from a checkpoint of step 8
    task = ledger.next_training_task("round-0")
    assert (task.global_batch_size, task.steps, task.size) == (16, 2, 32)


@pytest.mark.parametrize("seed", range(6))
def test_exactly_once_and_on_trace_under_interruptions_and_failures(seed):
    rng = random.Random(seed)
    ledger = make_ledger(shuffle=seed % 2 == 1, seed=seed)
    seen: Counter = Counter()
    version = 0  # the model's optimizer steps, as the workers count them
    off_trace = 0
    while not ledger.training_finished():
        ledger.next_step = version  # a round forms at the model's version (rounds.settle)
        while (task := ledger.next_training_task("round")) is not None:
            roll, k = rng.random(), rng.randrange(task.steps)
            run = k if roll < 0.3 else task.steps
            for j in range(run):
                off_trace += task.global_batch_size != TRACE.global_batch(version)
                lo = task.start + j * task.global_batch_size
                for record in range(lo, min(task.end, lo + task.global_batch_size)):
                    seen[(task.epoch, task.source, record)] += 1
                version += 1
            if roll < 0.15:  # the round broke inside the task: the rest goes back, a new round forms
                ledger.interrupt(task.task_id, k)
                break
            if roll < 0.3:  # step k's data failed: the round goes on with the next task
                ledger.fail(task.task_id, k, "bad record")
                continue
            ledger.complete(task.task_id)
    want = {(e, s.source, r) for e in range(3) for s in SHARDS for r in range(s.start, s.end)}
    assert set(seen) == want and set(seen.values()) == {1}
    assert ledger.records_done == ledger.records_total == 900
    assert off_trace == 0  # every step ran with the G the trace gives its global step
