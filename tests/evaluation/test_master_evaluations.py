"""The master's evaluations and prediction hand-out, driven directly (no gRPC, no processes)."""

from __future__ import annotations

import json

from flextrain.data import Shard
from flextrain.data.predictions import MANIFEST, write_part
from flextrain.job import JobSpec, JobType
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.ledger import TaskKind, TaskLedger
from flextrain.proto import flextrain_pb2 as pb

G = 10
JOIN, TASK = pb.JoinRendezvousResponse, pb.GetTaskResponse


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def make_master(tmp_path, *, records=80, eval_records=30, every=2, workers=2, job_type=JobType.TRAINING,
                prediction=None):
    training = job_type is JobType.TRAINING
    spec = JobSpec.of(
        name="job", model_def="m.py:Model", training_data="d" if training else None, job_dir=str(tmp_path),
        validation_data="v" if eval_records else None, evaluation_steps=every if training else 0,
        global_batch_size=G, steps_per_task=2, workers=workers, min_workers=1, job_type=job_type,
        checkpoint=None if training else "model.ckpt", prediction_data="p" if prediction else None,
        output=str(tmp_path / "out") if prediction else None,
    ).validate()
    ledger = TaskLedger(shards=[Shard("s.rio", 0, records)] if training else [], epochs=1 if training else 0,
                        global_batch_size=G, steps_per_task=2,
                        evaluation_shards=[Shard("v.rio", 0, eval_records)] if eval_records else [],
                        prediction_shards=prediction)
    master = JobMaster(spec, ledger, clock=Clock())
    if not training:
        master.final_checkpoint = "model.ckpt"
    return master


def pos(round_id=-1, task_index=0, steps_done=0, version=0):
    return pb.Position(round_id=round_id, task_index=task_index, steps_done=steps_done, version=version)


def form(master, workers):
    for w in workers:
        master.register(w)
    for w in workers:
        master.clock.now += 1
        resp = master.join(w, pos(), wait=0)
    assert resp.action == JOIN.TRAIN
    return resp.round_id


def train_task(master, wid, round_id, index):
    return master.get_task(pb.GetTaskRequest(worker_id=wid, round_id=round_id, task_index=index,
                                             position=pos(round_id, index)))


def eval_task(master, wid, version, position=None):
    return master.get_task(pb.GetTaskRequest(worker_id=wid, round_id=-1, kind=pb.Task.EVALUATION,
                                             model_version=version, position=position or pos()))


def report(master, wid, task_id, ok=True, **kw):
    master.report_task(pb.ReportTaskRequest(worker_id=wid, task_id=task_id, ok=ok, **kw))


def test_periodic_evaluation_survives_a_member_dying_mid_evaluation(tmp_path):
    master = make_master(tmp_path)
    r = form(master, ["A", "B"])
    t0 = train_task(master, "A", r, 0).task
    assert train_task(master, "B", r, 0).task == t0
    at2 = pos(r, 0, 2, 2)  # both committed the task's 2 steps: version 2, an evaluation step
    assert eval_task(master, "A", 3, pos(r, 0, 2, 3)).action == TASK.WAIT  # not an evaluation step
    e1, e2 = eval_task(master, "A", 2, at2).task, eval_task(master, "B", 2, at2).task
    assert (e1.kind, e1.model_version, e1.start, e1.end) == (pb.Task.EVALUATION, 2, 0, 20)
    assert (e2.model_version, e2.start, e2.end) == (2, 20, 30)
    assert eval_task(master, "A", 2, at2).action == TASK.WAIT  # B holds the last task
    master.worker_exited("B")  # dies mid-evaluation: its task goes back
    again = eval_task(master, "A", 2, at2)
    assert again.action == TASK.RUN and again.task.task_id == e2.task_id
    report(master, "A", e1.task_id, metric_sums={"m": 20 * 2.0}, samples=20)
    assert master.evaluations.history == []
    report(master, "A", e2.task_id, metric_sums={"m": 10 * 5.0}, samples=10)
    [entry] = master.evaluations.history
    assert (entry["step"], entry["metrics"], entry["samples"]) == (2, {"m": 3.0}, 30)
    assert master.metrics == {"m": 3.0} and "evaluation at step 2: m=3.0000 (30 samples)" in master.events
    assert eval_task(master, "A", 2, at2).action == TASK.NO_MORE  # back to training
    # training stayed exactly-once: the survivor's position settles the broken round
    master.clock.now += 1
    resp = master.join("A", at2, wait=0)
    assert resp.action == JOIN.TRAIN and resp.world_size == 1
    assert master.ledger.records_done == 20
    assert train_task(master, "A", resp.round_id, 0).task.start == 20


def test_final_evaluation_is_not_repeated_for_a_step_already_evaluated(tmp_path):
    master = make_master(tmp_path, records=40, eval_records=10, every=2, workers=1)
    r = form(master, ["A"])
    for index, version in ((0, 2), (1, 4)):
        train_task(master, "A", r, index)
        e = eval_task(master, "A", version, pos(r, index, 2, version)).task
        report(master, "A", e.task_id, metric_sums={"m": float(version) * 10}, samples=10)
    assert train_task(master, "A", r, 2).action == TASK.NO_MORE
    master.report_checkpoint(pb.ReportCheckpointRequest(worker_id="A", path="final.ckpt", position=pos(r, 2, 0, 4),
                                                        final=True))
    assert master.phase is Phase.RUNNING  # the final evaluation is still to be asked for
    assert eval_task(master, "A", 4).action == TASK.STOP  # step 4 was evaluated: nothing to repeat
    assert master.phase is Phase.SUCCEEDED
    assert [e["step"] for e in master.evaluations.history] == [2, 4] and master.metrics == {"m": 4.0}


def test_final_evaluation_of_a_step_between_evaluation_steps(tmp_path):
    master = make_master(tmp_path, records=30, eval_records=10, every=2, workers=1)
    r = form(master, ["A"])
    train_task(master, "A", r, 0)
    e = eval_task(master, "A", 2, pos(r, 0, 2, 2)).task
    report(master, "A", e.task_id, metric_sums={"m": 1.0}, samples=10)
    train_task(master, "A", r, 1)  # the last task: 1 step
    assert train_task(master, "A", r, 2).action == TASK.NO_MORE
    final = eval_task(master, "A", 3).task
    assert final.model_version == 3
    report(master, "A", final.task_id, metric_sums={"m": 5.0}, samples=10)
    assert [(e["step"], e["metrics"]["m"]) for e in master.evaluations.history] == [(2, 0.1), (3, 0.5)]


def test_rollback_cuts_an_unfinished_evaluation_again(tmp_path):
    master = make_master(tmp_path, records=80, eval_records=30, every=2, workers=1)
    r = form(master, ["A"])
    train_task(master, "A", r, 0)
    e1 = eval_task(master, "A", 2, pos(r, 0, 2, 2)).task
    report(master, "A", e1.task_id, metric_sums={"m": 999.0}, samples=20)  # half the evaluation
    master.worker_exited("A")  # the whole round is gone: model and ledger roll back to the start
    assert master.ledger.pending(TaskKind.EVALUATION, 2)  # (released, until the rollback)
    r2 = form(master, ["C"])
    assert r2 != r and master.ledger.records_done == 0
    assert not master.ledger.pending(TaskKind.EVALUATION) and master.evaluations.running == {}
    train_task(master, "C", r2, 0)
    tasks = [eval_task(master, "C", 2, pos(r2, 0, 2, 2)).task for _ in range(2)]
    assert [(t.start, t.end) for t in tasks] == [(0, 20), (20, 30)]  # cut afresh
    for t in tasks:
        report(master, "C", t.task_id, metric_sums={"m": 3.0 * (t.end - t.start)}, samples=t.end - t.start)
    assert master.evaluations.history[0]["metrics"] == {"m": 3.0}  # the lost half is not counted


def test_evaluation_only_job_evaluates_the_checkpoint_version(tmp_path):
    master = make_master(tmp_path, eval_records=30, job_type=JobType.EVALUATION)
    a, b = eval_task(master, "A", 7).task, eval_task(master, "B", 7).task
    assert master.phase is Phase.RUNNING and a.model_version == b.model_version == 7
    report(master, "B", b.task_id, ok=False, error="boom")  # retried
    b2 = eval_task(master, "A", 7).task
    assert b2.task_id == b.task_id
    report(master, "A", a.task_id, metric_sums={"acc": 15.0}, samples=20)
    report(master, "A", b2.task_id, metric_sums={"acc": 9.0}, samples=10)
    assert master.phase is Phase.SUCCEEDED and master.metrics == {"acc": 0.8}
    assert "evaluation at step 7: acc=0.8000 (30 samples)" in master.message


def prediction_master(tmp_path):
    shards = [Shard("a.rio", 0, 25), Shard("b.rio", 0, 15)]
    return make_master(tmp_path, eval_records=0, job_type=JobType.PREDICTION, prediction=shards)


def predict(master, wid):
    return master.get_task(pb.GetTaskRequest(worker_id=wid, round_id=-1, kind=pb.Task.PREDICTION,
                                             position=pos()))


def rows(task):
    return [{"source": task.source, "index": i, "prediction": [0.0]} for i in range(task.start, task.end)]


def test_prediction_tasks_in_input_order_and_a_checked_manifest(tmp_path):
    master = prediction_master(tmp_path)
    tasks = [predict(master, "A").task for _ in range(3)]
    assert [(t.kind, t.source, t.start, t.end) for t in tasks] == [
        (pb.Task.PREDICTION, "a.rio", 0, 20), (pb.Task.PREDICTION, "a.rio", 20, 25),
        (pb.Task.PREDICTION, "b.rio", 0, 15)]
    assert [t.task_id for t in tasks] == sorted(t.task_id for t in tasks)
    assert predict(master, "B").action == TASK.WAIT  # A holds the last tasks
    report(master, "A", tasks[0].task_id, samples=19)  # a row short: the task fails and is retried
    retry = predict(master, "B").task
    assert retry.task_id == tasks[0].task_id and master.phase is Phase.RUNNING
    for task in (retry, tasks[1], tasks[2]):
        write_part(tmp_path / "out", task.task_id, rows(task), writer="B")
        report(master, "B", task.task_id, samples=task.end - task.start)
    assert master.phase is Phase.SUCCEEDED and master.message == f"40 predictions written to {tmp_path / 'out'}"
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["rows"] == 40
    assert [(p["source"], p["start"], p["end"], p["rows"]) for p in manifest["parts"]] == [
        ("a.rio", 0, 20, 20), ("a.rio", 20, 25, 5), ("b.rio", 0, 15, 15)]


def test_prediction_job_fails_when_a_part_is_missing(tmp_path):
    master = prediction_master(tmp_path)
    tasks = [predict(master, "A").task for _ in range(3)]
    for task in tasks[:2]:
        write_part(tmp_path / "out", task.task_id, rows(task), writer="A")
    for task in tasks:
        report(master, "A", task.task_id, samples=task.end - task.start)
    assert master.phase is Phase.FAILED
    assert f"part-{tasks[2].task_id:06d}.jsonl is missing" in master.message


def test_prediction_row_count_mismatch_beyond_retries_fails_the_job(tmp_path):
    master = prediction_master(tmp_path)
    master.ledger.max_retries = 0
    task = predict(master, "A").task
    report(master, "A", task.task_id, samples=3)
    assert master.phase is Phase.FAILED
    assert "A wrote 3 predictions for the 20 records of a.rio [0, 20)" in master.message


def test_status_progress_of_inference_jobs_counts_their_records(tmp_path):
    from flextrain.master.status import StatusReporter

    master = prediction_master(tmp_path)
    reporter = StatusReporter(master, path=tmp_path / "status.json", desired=lambda: 1, master_address="x",
                              show_progress=False)
    assert reporter.snapshot()["progress"] == {"recordsDone": 0, "recordsTotal": 40, "percent": 0.0}
    task = predict(master, "A").task
    write_part(tmp_path / "out", task.task_id, rows(task), writer="A")
    report(master, "A", task.task_id, samples=20)
    assert reporter.snapshot()["progress"] == {"recordsDone": 20, "recordsTotal": 40, "percent": 50.0}

    evaluation = make_master(tmp_path / "e", eval_records=30, job_type=JobType.EVALUATION)
    reporter = StatusReporter(evaluation, path=tmp_path / "s2.json", desired=lambda: 1, master_address="x",
                              show_progress=False)
    assert reporter.snapshot()["progress"]["recordsDone"] == 0
    e = eval_task(evaluation, "A", 1).task
    report(evaluation, "A", e.task_id, metric_sums={}, samples=20)
    snap = reporter.update()
    assert snap["progress"] == {"recordsDone": 20, "recordsTotal": 30, "percent": 66.7}


def test_without_validation_data_there_is_nothing_to_evaluate(tmp_path):
    master = make_master(tmp_path, records=20, eval_records=0, every=0, workers=1)
    r = form(master, ["A"])
    train_task(master, "A", r, 0)
    assert train_task(master, "A", r, 1).action == TASK.NO_MORE
    assert eval_task(master, "A", 2).action == TASK.NO_MORE
    assert master.evaluations.history == [] and master.metrics == {}
    master.report_checkpoint(pb.ReportCheckpointRequest(worker_id="A", path="final.ckpt", position=pos(r, 1, 0, 2),
                                                        final=True))
    assert master.phase is Phase.SUCCEEDED
