"""Records of a job's history that the e2e job of test_job_history.py does not make: a job failed by a
worker's task report (no exit to judge), and a scale recorded when it was asked, before its launches.
A real JobMaster, its StatusReporter and HistoryRecorder, driven directly."""

from __future__ import annotations

from flextrain.data import Shard
from flextrain.job import JobSpec
from flextrain.master.coordinator import JobMaster
from flextrain.master.history import HistoryRecorder, read_events
from flextrain.master.ledger import TaskLedger
from flextrain.master.status import StatusReporter
from flextrain.proto import flextrain_pb2 as pb


def _job(tmp_path, *, retries=3, workers=1, clock=None):
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=10, tensorboard=False, max_task_retries=retries, workers=workers,
                      max_workers=3).validate()
    job = JobMaster(spec, TaskLedger(shards=[Shard("s.rio", 0, 40)], epochs=1, global_batch_size=10,
                                     steps_per_task=2, max_retries=retries), **({"clock": clock} if clock else {}))
    history = HistoryRecorder(job, path=tmp_path / "events.jsonl", resume=False, interval=0)
    desired = [workers]
    reporter = StatusReporter(job, path=tmp_path / "status.json", desired=lambda: desired[0],
                              master_address="127.0.0.1:1", show_progress=False, sinks=(history,))
    return job, history, reporter, desired


def test_a_job_failed_by_its_own_code_in_a_task_records_the_failure_and_the_plot_marks_it(tmp_path):
    from flextrain.cli.plot import draw

    job, history, reporter, _ = _job(tmp_path, retries=0)  # the task's first failure is its last
    job.worker_launched("worker-0")
    job.register("worker-0")
    assert job.join("worker-0", pb.Position(round_id=-1), wait=0).action == pb.JoinRendezvousResponse.TRAIN
    reporter.update()
    task = job.get_task(pb.GetTaskRequest(worker_id="worker-0", round_id=0, task_index=0,
                                          position=pb.Position(round_id=0))).task
    boom = pb.Failure(kind="UserCode", exit_code=3, exception="RuntimeError", message="boom at 16",
                      location="/slow.py:8 in feed", stage="training")
    job.report_task(pb.ReportTaskRequest(worker_id="worker-0", task_id=task.task_id, ok=False, error="boom",
                                         failure=boom))
    assert job.over and job.failure.kind.value == "UserCode"
    reporter.update()
    history.close()
    records = read_events(tmp_path)
    failure, = [r for r in records if r["type"] == "failure"]
    assert failure["worker"] == "worker-0" and failure["kind"] == "UserCode" and failure["why"] == "failed"
    assert "RuntimeError: boom at 16 (at /slow.py:8 in feed)" in failure["detail"]
    assert records[-1]["type"] == "phase" and records[-1]["phase"] == "Failed"  # the failure before the end
    assert records.index(failure) < len(records) - 1
    summary = draw(records)
    assert summary.markers["failure"] == 1 and "worker-0 failed" in summary.labels


def test_a_scale_is_recorded_when_asked_before_the_launches_it_causes(tmp_path):
    from flextrain.master.instances import InstanceManager
    from ft_helpers import FakeBackend

    now = [1000.0]  # the job's (monotonic) clock, moved by hand
    job, history, reporter, desired = _job(tmp_path, clock=lambda: now[0])
    backend = FakeBackend()
    manager = InstanceManager(backend, desired=1, relaunch_budget=1, worker_args=lambda w: (),
                              worker_env=lambda w: {}, on_launch=job.worker_launched, on_exit=lambda w, c: None,
                              on_budget_exhausted=lambda m: None, on_retire=lambda w: None,
                              on_desired=job.desired_changed)
    desired[0] = 1
    manager.reconcile()
    job.register("worker-0")
    assert job.join("worker-0", pb.Position(round_id=-1), wait=0).action == pb.JoinRendezvousResponse.TRAIN
    reporter.update()
    now[0] += 5
    manager.scale(2)  # launches worker-1 at once
    desired[0] = 2
    now[0] += 1.5  # the next status snapshot comes later
    reporter.update()
    manager.release_all()  # a suspend, and its resume
    for worker in sorted(backend.live):
        backend.exit(worker, 0)
    manager.scale(2)
    reporter.update()
    history.close()
    records = [r for r in read_events(tmp_path) if r["type"] in ("scale", "launch")]
    assert [(r["type"], r.get("previous"), r.get("desired"), r.get("worker")) for r in records] == [
        ("scale", 1, 2, None), ("launch", None, None, "worker-1"),
        ("scale", 2, 0, None), ("scale", 0, 2, None), ("launch", None, None, "worker-2"), ("launch", None, None, "worker-3"),
    ]
    scale, launch = records[:2]
    assert scale["time"] <= launch["time"] <= scale["time"] + 0.1  # asked, then launched: not 1.5 s late
