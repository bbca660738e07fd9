"""Periodic evaluations of ParameterServer jobs on the master, driven directly (no processes):
who gets which evaluation task, and that an evaluation whose worker died is still completed."""

from __future__ import annotations

from flextrain.data import Shard
from flextrain.job import JobSpec, Strategy
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.ledger import TaskLedger
from flextrain.proto import flextrain_pb2 as pb

G = 10
TASK = pb.GetTaskResponse


def make_master(tmp_path, *, evaluation_steps=2) -> JobMaster:
    # 60 records: 6 minibatches in 3 tasks of 2; validation: two files -> two tasks per evaluation
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", validation_data="v",
                   job_dir=str(tmp_path), global_batch_size=G, steps_per_task=2, workers=2,
                   strategy=Strategy.PARAMETER_SERVER, ps=1, evaluation_steps=evaluation_steps).validate()
    ledger = TaskLedger(shards=[Shard("s.rio", 0, 60)], epochs=1, global_batch_size=G, steps_per_task=2,
                        evaluation_shards=[Shard("v1.rio", 0, 3), Shard("v2.rio", 0, 2)])
    return JobMaster(spec, ledger)


def ask(m, wid, *, kind=pb.Task.TRAINING, version=0):
    return m.get_task(pb.GetTaskRequest(worker_id=wid, round_id=0, kind=kind, model_version=version,
                                        position=pb.Position(round_id=0, version=version)))


def evaluate(m, wid, version):
    return ask(m, wid, kind=pb.Task.EVALUATION, version=version)


def report(m, wid, task, *, step, samples):
    """Metric 'step' per sample = the model version the worker evaluated (as the stepcount model)."""
    m.report_task(pb.ReportTaskRequest(worker_id=wid, task_id=task.task_id, ok=True,
                                       metric_sums={"step": float(step * samples)}, samples=samples))


def test_the_worker_that_reached_the_step_evaluates_while_others_train(tmp_path):
    m = make_master(tmp_path)
    a, b = ask(m, "worker-0"), ask(m, "worker-1")
    assert a.action == b.action == TASK.RUN
    e1 = evaluate(m, "worker-0", 2)  # its push reached version 2
    assert e1.action == TASK.RUN and e1.task.kind == pb.Task.EVALUATION and e1.task.model_version == 2
    assert ask(m, "worker-1").action == TASK.RUN  # training goes on for the other worker
    e2 = evaluate(m, "worker-0", 2)
    assert e2.action == TASK.RUN and e2.task.task_id != e1.task.task_id
    assert evaluate(m, "worker-0", 2).action == TASK.WAIT  # its own last task is out
    report(m, "worker-0", e1.task, step=3, samples=3)  # the model pulled was at version 3 >= 2
    report(m, "worker-0", e2.task, step=3, samples=2)
    assert evaluate(m, "worker-0", 2).action == TASK.NO_MORE
    assert [(h["step"], h["metrics"], h["samples"]) for h in m.evaluations.history] == [(2, {"step": 3.0}, 5)]
    # a version that is no evaluation step: nothing to do while training runs
    assert evaluate(m, "worker-1", 3).action == TASK.WAIT


def test_an_evaluation_whose_worker_died_is_finished_by_a_worker_at_a_later_step(tmp_path):
    m = make_master(tmp_path)
    a = ask(m, "worker-0")
    ask(m, "worker-1")
    e = evaluate(m, "worker-0", 2)
    assert e.action == TASK.RUN
    m.worker_exited("worker-0")  # its training task and both evaluation tasks of version 2 go back
    assert a.task.task_id not in m.ledger.doing
    # worker-1 reaches version 4: it first takes what is left of the evaluation of version 2
    taken = [evaluate(m, "worker-1", 4) for _ in range(4)]
    assert [t.task.model_version for t in taken] == [2, 2, 4, 4]
    for t in taken:
        report(m, "worker-1", t.task, step=4, samples=3 if t.task.source == "v1.rio" else 2)
    assert [h["step"] for h in m.evaluations.history] == [2, 4]
    assert evaluate(m, "worker-1", 4).action == TASK.NO_MORE


def test_leftovers_of_a_periodic_evaluation_go_to_the_final_evaluators(tmp_path):
    m = make_master(tmp_path, evaluation_steps=4)
    tasks = [ask(m, "worker-0"), ask(m, "worker-1")]
    assert evaluate(m, "worker-0", 4).action == TASK.RUN
    m.worker_exited("worker-0")  # dies mid-evaluation of version 4; nobody else reaches a later step
    while True:  # worker-1 trains the rest
        t = ask(m, "worker-1")
        if t.action != TASK.RUN:
            break
        m.report_task(pb.ReportTaskRequest(worker_id="worker-1", task_id=t.task.task_id, ok=True))
    m.report_task(pb.ReportTaskRequest(worker_id="worker-1", task_id=tasks[1].task.task_id, ok=True))
    assert ask(m, "worker-1").action == TASK.NO_MORE and m.ledger.training_finished()
    versions = []
    while (r := evaluate(m, "worker-1", 6)).action == TASK.RUN:  # final model: version 6
        versions.append(r.task.model_version)
        report(m, "worker-1", r.task, step=6, samples=3 if r.task.source == "v1.rio" else 2)
    assert sorted(versions) == [4, 4, 6, 6]
    assert [h["step"] for h in m.evaluations.history] == [4, 6]
    assert m.phase is Phase.SUCCEEDED and m.metrics["step"] == 6.0
