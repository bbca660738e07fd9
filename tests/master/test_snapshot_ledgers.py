"""The master resolves in-memory snapshots on its own (no per-snapshot mark): a snapshot whose state
is in shared memory before the ledger records an outcome gets the ledger of exactly its model
(resolved just before that outcome); one whose state lands after an outcome its model lacks
(``moved_past``) is refused and removed. Never a ledger with a wrong position."""

from __future__ import annotations

import pytest
import torch
from test_coordinator import TASK, G, Clock, form, get, heartbeat, pos, report

from flextrain.data import Shard
from flextrain.elastic.flash import ENV_ROOT, stem
from flextrain.elastic.statecodec import encode
from flextrain.job import JobSpec
from flextrain.master.checkpoints import CheckpointStore
from flextrain.master.coordinator import JobMaster
from flextrain.master.ledger import TaskLedger
from flextrain.proto import flextrain_pb2 as pb

STEPS = 4  # per task: 3 tasks of 40 records


@pytest.fixture(autouse=True)
def _shm(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_ROOT, str(tmp_path / "shm"))


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


def snap(master, position) -> str:
    """Rank 0's writer: the snapshot's state into shared memory (no RPC)."""
    master.flash.put_state(encode({"version": position.version}), position)
    return stem(position)


def resolved(master, name) -> dict | None:
    """The ledger the master gave snapshot ``name`` (resolving what is pending now), None if refused."""
    with master.cond:
        master.resolve_snapshots()
    return master.snapshot_ledgers.get(name)


def todo_starts(ledger: dict) -> list[int]:
    return sorted(t["start"] for t in ledger["todo"])


def test_steps_of_the_same_task_committed_meanwhile_leave_the_answer_exact(tmp_path):
    master, r, t0 = make(tmp_path)
    name = snap(master, pos(r, 0, 1, 1))
    heartbeat(master, "B", pos(r, 0, 3, 3))  # B went on inside the task: no outcome yet
    ledger = resolved(master, name)
    assert ledger["records_done"] == G and todo_starts(ledger) == [G, 40, 80]
    snapshot, _ = master.flash.latest()  # its ledger file beside it: a resume without this master uses it
    assert snapshot.version == 1 and snapshot.ledger == ledger


def test_a_snapshot_in_memory_before_its_task_fails_later_is_resolved_just_before_the_failure(tmp_path):
    master, r, t0 = make(tmp_path)
    name = snap(master, pos(r, 0, 1, 1))
    report(master, "B", t0.task_id, ok=False, steps_done=3, error="bad record")  # steps 2-3 committed, 4 failed
    assert master.ledger.records_done == 3 * G
    ledger = master.snapshot_ledgers[name]  # resolved by the failure's outcome, before it was recorded
    assert ledger["records_done"] == G and todo_starts(ledger) == [G, 40, 80]


def test_the_snapshots_task_failing_at_a_later_step_before_it_lands_refuses_it(tmp_path):
    master, r, t0 = make(tmp_path)
    report(master, "B", t0.task_id, ok=False, steps_done=3, error="bad record")
    name = snap(master, pos(r, 0, 1, 1))  # the writer was slow: the ledger already counts 3 steps
    assert resolved(master, name) is None and master.snapshots_refused == 1
    assert master.flash.versions() == [] and master.flash.latest() == (None, [])


def test_a_failure_at_the_snapshots_own_step_keeps_it_exact(tmp_path):
    master, r, t0 = make(tmp_path)
    report(master, "B", t0.task_id, ok=False, steps_done=1, error="bad record")  # the very next step failed
    ledger = resolved(master, snap(master, pos(r, 0, 1, 1)))
    assert ledger["records_done"] == G and todo_starts(ledger) == [G, 40, 80]


def test_the_snapshots_task_completed_while_the_model_is_inside_it(tmp_path):
    master, r, t0 = make(tmp_path)
    early = snap(master, pos(r, 0, 1, 1))  # in memory before the completion: resolved just before it
    t1 = get(master, "B", r, 1).task  # B's plain ask for task 1 commits task 0
    assert t0.task_id not in master.ledger.doing and t1.task_id in master.ledger.doing
    assert master.snapshot_ledgers[early]["records_done"] == G
    assert resolved(master, snap(master, pos(r, 0, 2, 2))) is None  # landed after: refused
    # a snapshot at task 0's end has exactly that outcome: task 0 done, task 1 back whole
    ledger = resolved(master, snap(master, pos(r, 0, STEPS, STEPS)))
    assert ledger["records_done"] == 40 and todo_starts(ledger) == [40, 80]


def test_a_later_task_with_steps_applied_refuses_it_and_one_failed_at_its_first_step_does_not(tmp_path):
    master, r, t0 = make(tmp_path)
    t1 = get(master, "B", r, 1).task
    report(master, "B", t1.task_id, ok=False, steps_done=0, error="bad record")  # nothing of it applied
    ledger = resolved(master, snap(master, pos(r, 0, STEPS, STEPS)))
    assert ledger["records_done"] == 40 and todo_starts(ledger) == [40, 80]
    t2 = get(master, "B", r, 2).task  # the requeued remainder of task 1
    report(master, "B", t2.task_id, ok=False, steps_done=2, error="bad record")
    # the same model (task 1 at step 0) landing now: the ledger counts 2 steps of task 1's remainder
    assert resolved(master, snap(master, pos(r, 1, 0, STEPS))) is None


def test_every_worker_lost_the_pending_snapshot_counts_its_tasks_no_member_reported(tmp_path):
    """The round died before any member reported passing task 0: the snapshot inside task 1 is
    flushed with task 0 done and task 1 applied up to its step (at most N steps redone)."""
    master, r, t0 = make(tmp_path)
    get(master, "A", r, 1, position=pos(r, 0, 0, 0))  # task 1 asked ahead: task 0 still DOING
    snap(master, pos(r, 1, 2, STEPS + 2))
    with master.cond:
        assert master.flush_flash() == STEPS + 2
    latest = master.checkpoints.latest()
    assert latest["ledger"]["records_done"] == 40 + 2 * G and todo_starts(latest["ledger"]) == [40 + 2 * G, 80]


def test_a_persisted_snapshots_report_is_recorded_with_its_ledger_and_keeps_the_newer_position(tmp_path):
    master, r, t0 = make(tmp_path)
    heartbeat(master, "A", pos(r, 0, 3, 3))
    snap(master, pos(r, 0, 1, 1))
    path = tmp_path / "checkpoints" / "ckpt-000000001.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode({"model": {"w": torch.ones(1)}, "version": 1}))
    master.report_checkpoint(pb.ReportCheckpointRequest(worker_id="A", path=str(path), position=pos(r, 0, 1, 1),
                                                        memory=True))
    assert master.workers["A"].position.version == 3
    latest = master.checkpoints.latest()
    assert latest["version"] == 1 and latest["ledger"]["records_done"] == G
    assert get(master, "A", r, 0).action == TASK.RUN


def test_a_persisted_snapshot_never_in_the_masters_shared_memory_is_resolved_at_its_report(tmp_path):
    """Kubernetes: the master's pod has its own shared memory; the report resolves the snapshot then."""
    master, r, t0 = make(tmp_path)
    for version, task_index, steps in ((1, 0, 1), (3, 0, 3)):
        path = tmp_path / "checkpoints" / f"ckpt-{version:09d}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode({"version": version}))
        if version == 3:
            get(master, "B", r, 1)  # task 0 completed before this report: its model (step 3) lacks step 4
        master.report_checkpoint(pb.ReportCheckpointRequest(
            worker_id="A", path=str(path), position=pos(r, task_index, steps, version), memory=True))
    latest = master.checkpoints.latest()
    assert latest["version"] == 1 and latest["ledger"]["records_done"] == G
