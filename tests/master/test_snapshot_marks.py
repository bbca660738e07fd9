"""An in-memory snapshot's mark, answered after the round went on: the master answers with the
ledger of exactly the snapshot's model, or "" (the snapshot is dropped) once its ledger holds an
outcome that model lacks. Never a ledger with a wrong position."""

from __future__ import annotations

import json

from test_coordinator import TASK, G, Clock, form, get, heartbeat, pos, report

from flextrain.data import Shard
from flextrain.job import JobSpec
from flextrain.master.accounting import ledger_at
from flextrain.master.checkpoints import CheckpointStore
from flextrain.master.coordinator import JobMaster
from flextrain.master.ledger import TaskLedger
from flextrain.proto import flextrain_pb2 as pb

STEPS = 4  # per task: 3 tasks of 40 records


def make(tmp_path, workers=("A", "B")):
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=G, steps_per_task=STEPS, workers=len(workers),
                      memory_checkpoint_steps=1).validate()
    ledger = TaskLedger(shards=[Shard("s.rio", 0, 3 * STEPS * G)], epochs=1, global_batch_size=G,
                        steps_per_task=STEPS, max_retries=3, renew_ids=True)
    clock = Clock()
    master = JobMaster(spec, ledger, clock=clock, checkpoints=CheckpointStore(tmp_path / "checkpoints"))
    r = form(master, clock, list(workers)).round_id
    tasks = [get(master, w, r, 0).task for w in workers]
    return master, r, tasks[0]


def mark(master, wid, position) -> dict | None:
    answer = master.report_checkpoint(pb.ReportCheckpointRequest(worker_id=wid, position=position, memory=True))
    return json.loads(answer.ledger_json) if answer.ledger_json else None


def todo_starts(ledger: dict) -> list[int]:
    return sorted(t["start"] for t in ledger["todo"])


def test_steps_of_the_same_task_committed_meanwhile_leave_the_answer_exact(tmp_path):
    master, r, t0 = make(tmp_path)
    heartbeat(master, "B", pos(r, 0, 3, 3))  # B went on inside the task; A's mark (step 1) arrives late
    ledger = mark(master, "A", pos(r, 0, 1, 1))
    assert ledger["records_done"] == G and todo_starts(ledger) == [G, 40, 80]


def test_the_snapshots_task_failing_at_a_later_step_drops_it(tmp_path):
    master, r, t0 = make(tmp_path)
    report(master, "B", t0.task_id, ok=False, steps_done=3, error="bad record")  # steps 2-3 committed, 4 failed
    assert master.ledger.records_done == 3 * G
    # what the mark would have been answered with before the check: 3 steps counted, the model holds 1
    assert ledger_at(master.ledger, master.rendezvous.current, pos(r, 0, 1, 1))["records_done"] == 3 * G
    assert mark(master, "A", pos(r, 0, 1, 1)) is None


def test_a_failure_at_the_snapshots_own_step_keeps_it_exact(tmp_path):
    master, r, t0 = make(tmp_path)
    report(master, "B", t0.task_id, ok=False, steps_done=1, error="bad record")  # the very next step failed
    ledger = mark(master, "A", pos(r, 0, 1, 1))
    assert ledger["records_done"] == G and todo_starts(ledger) == [G, 40, 80]


def test_the_snapshots_task_completed_while_the_model_is_inside_it_drops_it(tmp_path):
    master, r, t0 = make(tmp_path)
    t1 = get(master, "B", r, 1).task  # B's plain ask for task 1 commits task 0
    assert t0.task_id not in master.ledger.doing and t1.task_id in master.ledger.doing
    assert mark(master, "A", pos(r, 0, 2, 2)) is None
    # a snapshot at task 0's end has exactly that outcome: task 0 done, task 1 back whole
    ledger = mark(master, "A", pos(r, 0, STEPS, STEPS))
    assert ledger["records_done"] == 40 and todo_starts(ledger) == [40, 80]


def test_a_later_task_with_steps_applied_drops_it_and_one_failed_at_its_first_step_does_not(tmp_path):
    master, r, t0 = make(tmp_path)
    t1 = get(master, "B", r, 1).task
    report(master, "B", t1.task_id, ok=False, steps_done=0, error="bad record")  # nothing of it applied
    ledger = mark(master, "A", pos(r, 0, STEPS, STEPS))
    assert ledger["records_done"] == 40 and todo_starts(ledger) == [40, 80]
    t2 = get(master, "B", r, 2).task  # the requeued remainder of task 1
    report(master, "B", t2.task_id, ok=False, steps_done=2, error="bad record")
    assert mark(master, "A", pos(r, 0, STEPS, STEPS)) is None


def test_a_late_mark_does_not_move_the_workers_position_back(tmp_path):
    master, r, t0 = make(tmp_path)
    heartbeat(master, "A", pos(r, 0, 3, 3))
    mark(master, "A", pos(r, 0, 1, 1))
    assert master.workers["A"].position.version == 3
    assert get(master, "A", r, 0).action == TASK.RUN
