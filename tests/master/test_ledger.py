"""The task ledger: dynamic sharding with exactly-once accounting."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from flextrain.data import Shard
from flextrain.master.ledger import Task, TaskKind, TaskLedger

G = 10
STEPS = 2  # steps per task -> 20 records per task


def make_ledger(**overrides) -> TaskLedger:
    kwargs = dict(
        shards=[Shard("a.rio", 0, 100), Shard("b.rio", 0, 45)],
        epochs=2,
        global_batch_size=G,
        steps_per_task=STEPS,
    )
    kwargs.update(overrides)
    return TaskLedger(**kwargs)


def drain(ledger: TaskLedger, owner: str = "round-0") -> list[Task]:
    """Every training task TODO now; with nothing TODO, the first ask cuts the next epoch: its tasks."""
    tasks = []
    while (not tasks or ledger.todo) and (task := ledger.next_training_task(owner)) is not None:
        tasks.append(task)
    return tasks


def ranges(tasks) -> list[tuple[str, int, int]]:
    return [(t.source, t.start, t.end) for t in tasks]


EPOCH_RANGES = [
    ("a.rio", 0, 20), ("a.rio", 20, 40), ("a.rio", 40, 60), ("a.rio", 60, 80), ("a.rio", 80, 100),
    ("b.rio", 0, 20), ("b.rio", 20, 40), ("b.rio", 40, 45),
]


# ---- cutting and epochs -------------------------------------------------------
def test_tasks_are_whole_minibatches_and_shard_tail_is_smaller():
    ledger = make_ledger()
    tasks = drain(ledger)
    assert ranges(tasks) == EPOCH_RANGES
    assert all(t.kind is TaskKind.TRAINING and t.epoch == 0 for t in tasks)
    assert all(t.global_batch_size == G for t in tasks)
    assert [t.steps for t in tasks] == [2] * 7 + [1]
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert all(t.owner == "round-0" for t in tasks)
    assert set(ledger.doing) == {t.task_id for t in tasks}


def test_task_records_in_steps():
    task = Task(0, TaskKind.TRAINING, "s", 40, 65, 0, 10)
    assert task.size == 25 and task.steps == 3
    assert [task.records_in_steps(n) for n in (-1, 0, 1, 2, 3, 9)] == [0, 0, 10, 20, 25, 25]


def test_epochs_are_cut_lazily_when_nothing_is_todo_even_with_tasks_doing():
    ledger = make_ledger()
    assert ledger.epoch == -1 and not ledger.todo  # nothing cut before the first ask
    tasks = drain(ledger)
    assert ledger.epoch == 0 and not ledger.todo
    for t in tasks[:-1]:
        ledger.complete(t.task_id)
    # one task of epoch 0 still DOING: the next ask cuts epoch 1 (no worker waits at the epoch's end)
    nxt = ledger.next_training_task("round-0")
    assert nxt is not None and nxt.epoch == 1 and ledger.epoch == 1
    assert (nxt.source, nxt.start, nxt.end) == EPOCH_RANGES[0]
    assert nxt.task_id not in {t.task_id for t in tasks}
    assert tasks[-1].task_id in ledger.doing  # still epoch 0's, still DOING
    # the last epoch cut, nothing more to cut: None until a remainder comes back
    rest = drain(ledger)
    assert ledger.epoch == 1 and ledger.next_training_task("round-0") is None
    ledger.interrupt(tasks[-1].task_id, 0)  # epoch 0's last task failed before any step: back to TODO
    again = ledger.next_training_task("round-0")
    assert again.epoch == 0 and (again.source, again.start, again.end) == EPOCH_RANGES[-1]
    for t in (nxt, *rest, again):
        ledger.complete(t.task_id)
    assert ledger.training_finished() and ledger.records_done == 2 * ledger.records_per_epoch


def test_new_epoch_not_cut_while_remainder_todo():
    ledger = make_ledger(shards=[Shard("a.rio", 0, 20)])
    task = ledger.next_training_task("r")
    ledger.interrupt(task.task_id, 1)
    again = ledger.next_training_task("r")
    assert again.epoch == 0 and (again.start, again.end) == (10, 20)
    assert ledger.epoch == 0


def test_records_total_done_and_training_finished():
    ledger = make_ledger(epochs=3)
    assert ledger.records_per_epoch == 145
    assert ledger.records_total == 435
    assert ledger.records_done == 0
    assert not ledger.training_finished()
    for epoch in range(3):
        tasks = drain(ledger)
        assert {t.epoch for t in tasks} == {epoch}
        assert not ledger.training_finished()  # tasks still DOING
        for i, t in enumerate(tasks):
            ledger.complete(t.task_id)
            assert ledger.records_done == 145 * epoch + sum(x.size for x in tasks[: i + 1])
        assert ledger.training_finished() == (epoch == 2)
    assert ledger.records_done == ledger.records_total
    assert ledger.next_training_task("r") is None
    assert ledger.epoch == 2  # never cuts past the last epoch
    assert ledger.training_finished()


# ---- shuffling ---------------------------------------------------------------
def epoch_orders(**kw) -> list[list[tuple[str, int, int]]]:
    ledger = make_ledger(epochs=3, **kw)
    out = []
    for _ in range(3):
        tasks = drain(ledger)
        out.append(ranges(tasks))
        for t in tasks:
            ledger.complete(t.task_id)
    return out


def test_shuffle_is_deterministic_per_seed_and_covers_same_records():
    a = epoch_orders(shuffle=True, seed=7)
    b = epoch_orders(shuffle=True, seed=7)
    plain = epoch_orders()
    other = epoch_orders(shuffle=True, seed=8)
    assert a == b
    assert plain == [EPOCH_RANGES] * 3
    for order in a + other:
        assert sorted(order) == sorted(EPOCH_RANGES)
    assert any(order != EPOCH_RANGES for order in a)
    assert len({tuple(o) for o in a}) > 1  # reshuffled per epoch (seed + epoch)
    assert a != other


# ---- interrupt / fail / release ------------------------------------------------
def test_interrupt_counts_committed_steps_and_requeues_remainder_at_front():
    ledger = make_ledger()
    first, second = ledger.next_training_task("r"), ledger.next_training_task("r")
    todo_before = len(ledger.todo)
    rest = ledger.interrupt(second.task_id, 1)
    assert ledger.records_done == G
    assert rest.task_id == second.task_id and (rest.start, rest.end) == (30, 40)
    assert rest.owner == "" and rest.retries == 0
    assert ledger.todo[0] is rest and len(ledger.todo) == todo_before + 1
    assert second.task_id not in ledger.doing and first.task_id in ledger.doing
    again = ledger.next_training_task("r2")
    assert (again.task_id, again.start, again.end, again.owner) == (second.task_id, 30, 40, "r2")


def test_interrupt_with_no_steps_requeues_whole_task():
    ledger = make_ledger()
    task = ledger.next_training_task("r")
    ledger.interrupt(task.task_id, 0)
    assert ledger.records_done == 0
    assert (ledger.todo[0].start, ledger.todo[0].end) == (0, 20)


@pytest.mark.parametrize("steps", [2, 5])
def test_interrupt_after_all_steps_counts_whole_task_and_requeues_nothing(steps):
    ledger = make_ledger()
    task = ledger.next_training_task("r")
    todo_before = list(ledger.todo)
    ledger.interrupt(task.task_id, steps)
    assert ledger.records_done == 20
    assert list(ledger.todo) == todo_before


def test_interrupt_of_short_tail_task_caps_at_its_size():
    ledger = make_ledger()
    tasks = drain(ledger)
    tail = tasks[-1]
    assert (tail.start, tail.end) == (40, 45)
    ledger.interrupt(tail.task_id, 1)
    assert ledger.records_done == 5
    assert not ledger.todo


def test_fail_retries_then_sets_error_and_stops_handing_out():
    ledger = make_ledger(max_retries=2)
    task = ledger.next_training_task("r")
    ledger.fail(task.task_id, 1, "CorruptRecordIOError: bad chunk")
    assert ledger.records_done == G  # the committed step stays applied
    assert ledger.todo[0].task_id == task.task_id and ledger.todo[0].retries == 1
    assert ledger.error is None
    t = ledger.next_training_task("r")
    assert t.task_id == task.task_id and (t.start, t.end) == (10, 20)
    ledger.fail(t.task_id, 0, "CorruptRecordIOError: bad chunk")
    assert ledger.error is None and ledger.todo[0].retries == 2
    t = ledger.next_training_task("r")
    ledger.fail(t.task_id, 0, "CorruptRecordIOError: bad chunk again")
    assert ledger.error is not None
    assert "a.rio" in ledger.error
    assert "[10, 20)" in ledger.error
    assert "bad chunk again" in ledger.error
    assert "3 times" in ledger.error
    assert ledger.records_done == G
    assert ledger.next_training_task("r") is None
    # Still owed, first: the ledger saved with the failure keeps the records, a resume trains them.
    assert (ledger.todo[0].start, ledger.todo[0].end) == (10, 20)
    assert ledger.to_dict()["todo"][0]["start"] == 10


def test_fail_with_zero_retries_allowed_fails_at_once():
    ledger = make_ledger(max_retries=0)
    task = ledger.next_training_task("r")
    ledger.fail(task.task_id, 0, "boom")
    assert ledger.error and "boom" in ledger.error


def test_release_owner_requeues_only_that_owners_tasks_whole():
    ledger = make_ledger()
    a1, b1, a2 = (ledger.next_training_task(o) for o in ("w1", "w2", "w1"))
    lost = ledger.release_owner("w1")
    assert sorted(t.task_id for t in lost) == sorted([a1.task_id, a2.task_id])
    assert set(ledger.doing) == {b1.task_id}
    assert ledger.records_done == 0
    front = {ledger.todo[0].task_id, ledger.todo[1].task_id}
    assert front == {a1.task_id, a2.task_id}
    assert all(t.owner == "" for t in lost)
    assert ranges(sorted(lost, key=lambda t: t.start)) == [("a.rio", 0, 20), ("a.rio", 40, 60)]
    assert ledger.release_owner("nobody") == []


# ---- evaluation ---------------------------------------------------------------
def test_evaluation_tasks_cut_only_when_asked():
    ledger = make_ledger(epochs=1, evaluation_shards=[Shard("v.rio", 0, 35)])
    assert not ledger.evaluation_finished()
    train = drain(ledger)
    assert all(t.kind is TaskKind.TRAINING for t in train)  # training never hands out evaluation
    assert not ledger.evaluation_cut
    for t in train:
        ledger.complete(t.task_id)
    done = ledger.records_done
    assert ledger.training_finished() and not ledger.evaluation_finished()
    e1 = ledger.next_evaluation_task("w1")
    e2 = ledger.next_evaluation_task("w2")
    assert ledger.next_evaluation_task("w3") is None
    assert [(t.kind, t.source, t.start, t.end) for t in (e1, e2)] == [
        (TaskKind.EVALUATION, "v.rio", 0, 20), (TaskKind.EVALUATION, "v.rio", 20, 35)]
    assert ledger.next_training_task("r") is None
    assert not ledger.evaluation_finished()
    ledger.release_owner("w2")  # its worker died: the evaluation task goes back
    assert ledger.next_evaluation_task("w1").task_id == e2.task_id
    ledger.complete(e1.task_id)
    assert not ledger.evaluation_finished()
    ledger.complete(e2.task_id)
    assert ledger.evaluation_finished()
    assert ledger.records_done == done  # evaluation records are not training progress


def test_evaluation_without_shards_finishes_once_asked():
    ledger = make_ledger(epochs=1)
    assert not ledger.evaluation_finished()
    assert ledger.next_evaluation_task("w") is None
    assert ledger.evaluation_finished()


# ---- persistence --------------------------------------------------------------
def test_to_dict_restore_round_trip_doing_comes_back_as_todo():
    ledger = make_ledger(shuffle=True, seed=3, evaluation_shards=[Shard("v.rio", 0, 5)])
    t1 = ledger.next_training_task("round-0")
    ledger.complete(t1.task_id)
    t2 = ledger.next_training_task("round-0")
    ledger.interrupt(t2.task_id, 1)
    doing = ledger.next_training_task("round-1")  # the remainder, DOING at snapshot time
    state = json.loads(json.dumps(ledger.to_dict()))  # must be plain JSON data

    fresh = make_ledger(shuffle=True, seed=3, evaluation_shards=[Shard("v.rio", 0, 5)])
    fresh.restore(state)
    assert fresh.epoch == ledger.epoch == 0
    assert fresh.records_done == ledger.records_done == 20 + G
    assert not fresh.doing
    assert fresh.todo[0].task_id == doing.task_id
    assert (fresh.todo[0].start, fresh.todo[0].end) == (doing.start, doing.end)
    assert fresh.todo[0].owner == ""
    assert ranges(fresh.todo) == [(doing.source, doing.start, doing.end)] + ranges(ledger.todo)
    assert [t.task_id for t in fresh.todo][1:] == [t.task_id for t in ledger.todo]
    # new ids continue after the restored ones
    rest = drain(fresh)
    for t in rest:
        fresh.complete(t.task_id)
    nxt = fresh.next_training_task("r")
    assert nxt.epoch == 1
    assert nxt.task_id >= state["next_id"]


def test_restore_keeps_retries_and_kind():
    ledger = make_ledger(epochs=1, evaluation_shards=[Shard("v.rio", 0, 5)])
    t = ledger.next_training_task("r")
    ledger.fail(t.task_id, 0, "x")
    for task in drain(ledger):
        ledger.complete(task.task_id) if task.task_id != t.task_id else None
    ev = ledger.next_evaluation_task("w")
    fresh = make_ledger(epochs=1, evaluation_shards=[Shard("v.rio", 0, 5)])
    fresh.restore(ledger.to_dict())
    by_id = {x.task_id: x for x in fresh.todo}
    assert by_id[t.task_id].retries == 1
    assert by_id[t.task_id].kind is TaskKind.TRAINING
    # evaluations are not persisted (their partial sums live in the master): cut again
    assert ev.task_id not in by_id and not fresh.evaluation_cut
    assert fresh.next_evaluation_task("w").kind is TaskKind.EVALUATION


# ---- exactly-once over a whole simulated run ------------------------------------
def simulate(seed: int, *, shuffle: bool) -> tuple[dict[int, Counter], TaskLedger]:
    rng = random.Random(seed)
    shards = [Shard("a.rio", 0, 137), Shard("b.rio", 10, 60), Shard("c.rio", 0, 7)]
    kw = dict(shards=shards, epochs=3, global_batch_size=6, steps_per_task=3, shuffle=shuffle,
              seed=seed, max_retries=10_000, evaluation_shards=[])
    ledger = TaskLedger(**kw)
    applied: dict[int, Counter] = {e: Counter() for e in range(3)}
    held: list[Task] = []
    snapshot = None

    def apply(task: Task, records: int) -> None:
        for r in range(task.start, task.start + records):
            applied[task.epoch][(task.source, r)] += 1

    for _ in range(100_000):
        if ledger.training_finished():
            break
        op = rng.random()
        if op < 0.35 or not held:
            owner = f"w{rng.randrange(3)}"
            task = ledger.next_training_task(owner)
            if task is not None:
                held.append(task)
            continue
        task = held.pop(rng.randrange(len(held)))
        if op < 0.65:
            apply(task, task.size)
            ledger.complete(task.task_id)
        elif op < 0.78:
            steps = rng.randrange(task.steps + 2)
            apply(task, min(task.size, steps * 6))  # what `steps` committed steps of G=6 applied
            ledger.interrupt(task.task_id, steps)
        elif op < 0.88:
            steps = rng.randrange(task.steps + 1)
            apply(task, min(task.size, steps * 6))
            ledger.fail(task.task_id, steps, "flaky read")
        elif op < 0.93:
            held.append(task)
            lost = ledger.release_owner(task.owner)
            held = [t for t in held if t.task_id not in {x.task_id for x in lost}]
        elif op < 0.97:
            held.append(task)
            snapshot = (json.dumps(ledger.to_dict()), {e: Counter(c) for e, c in applied.items()})
        else:
            held.append(task)
            if snapshot is not None:  # the master restarts from its last persisted state
                ledger = TaskLedger(**kw)
                ledger.restore(json.loads(snapshot[0]))
                applied = {e: Counter(c) for e, c in snapshot[1].items()}
                held = []
    else:
        pytest.fail("simulation did not finish")
    return applied, ledger


@pytest.mark.parametrize("seed, shuffle", [(s, s % 2 == 0) for s in range(8)])
def test_every_record_applied_exactly_once_per_epoch(seed, shuffle):
    applied, ledger = simulate(seed, shuffle=shuffle)
    expected = {("a.rio", r) for r in range(137)} | {("b.rio", r) for r in range(10, 60)} | {
        ("c.rio", r) for r in range(7)}
    for epoch, counts in applied.items():
        assert set(counts) == expected, f"epoch {epoch}: missing {sorted(expected - set(counts))[:5]}"
        dup = {k: v for k, v in counts.items() if v != 1}
        assert not dup, f"epoch {epoch}: applied more than once: {sorted(dup.items())[:5]}"
    assert ledger.error is None
    assert ledger.records_done == ledger.records_total == 3 * 194
    assert not ledger.todo and not ledger.doing
