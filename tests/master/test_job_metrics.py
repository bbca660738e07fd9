"""The master's Prometheus endpoint (flextrain/master/metrics.py), on its own: a real JobMaster's status
snapshot handed to JobMetrics, served over HTTP on loopback, scraped and parsed with prometheus_client's
own parser."""

from __future__ import annotations

import pytest
from ft_helpers import scrape

from flextrain.data import Shard
from flextrain.job import JobSpec
from flextrain.master.coordinator import JobMaster
from flextrain.master.ledger import TaskLedger
from flextrain.master.metrics import JobMetrics, start_metrics
from flextrain.master.status import StatusReporter
from flextrain.proto import flextrain_pb2 as pb


@pytest.fixture
def served(tmp_path):
    spec = JobSpec.of(name="metrics-job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=10, steps_per_task=2, workers=2).validate()
    job = JobMaster(spec, TaskLedger(shards=[Shard("s.rio", 0, 100)], epochs=1, global_batch_size=10,
                                     steps_per_task=2))
    metrics = start_metrics(spec, host="127.0.0.1")
    reporter = StatusReporter(job, path=tmp_path / "status.json", desired=lambda: 2, master_address="x:1",
                              show_progress=False, sinks=(metrics,), metrics_url=metrics.url)
    yield job, reporter, metrics
    reporter.close()
    metrics.close()


def test_a_scrape_shows_the_jobs_figures_as_status_json_has_them(served):
    job, reporter, metrics = served
    job.ledger.complete(job.ledger.next_training_task("round-0").task_id)
    job.ledger.next_training_task("round-0")
    snap = reporter.update()
    assert snap["metricsUrl"] == metrics.url and metrics.url.startswith("http://127.0.0.1:")
    got = scrape(metrics.url)
    assert got[("flextrain_job_info", (("job", "metrics-job"), ("phase", "Pending")))] == 1
    assert got[("flextrain_job_phase", (("phase", "Pending"),))] == 1
    assert got[("flextrain_job_phase", (("phase", "Running"),))] == 0
    assert got[("flextrain_workers", (("state", "desired"),))] == 2
    assert got[("flextrain_workers", (("state", "active"),))] == 0
    tasks = {state: got[("flextrain_tasks", (("state", state),))] for state in ("todo", "doing", "done")}
    assert tasks == {"todo": 3, "doing": 1, "done": 1}  # 100 records / (2 steps x 10): 5 tasks
    assert got[("flextrain_samples_total", ())] == 20 and got[("flextrain_step", ())] == 0
    assert got[("flextrain_global_batch", ())] == 10
    assert got[("flextrain_recovery_seconds_count", ())] == 0


def test_round_timings_are_observed_once_and_relaunches_counted_by_cause(served):
    job, reporter, metrics = served
    for w in ("worker-0", "worker-1"):
        job.worker_launched(w)
        job.register(w)
    assert job.join("worker-0", pb.Position(round_id=-1), wait=0).action == pb.JoinRendezvousResponse.WAIT
    assert job.join("worker-1", pb.Position(round_id=-1), wait=0).action == pb.JoinRendezvousResponse.TRAIN
    job.worker_launched("worker-2")
    job.register("worker-2")  # the round is to end at its next step boundary...
    job.worker_exited("worker-1")  # ... but a member is lost first: a recovery starts
    job.join("worker-0", pb.Position(round_id=0), wait=0)
    assert job.join("worker-2", pb.Position(round_id=-1), wait=0).action == pb.JoinRendezvousResponse.TRAIN
    assert job.worker_failed("worker-1", 137)  # SIGKILL: relaunched
    reporter.update()
    reporter.update()  # the same rounds again: observed once
    second = reporter.snapshot()["roundHistory"][-1]
    assert set(second["joinSeconds"]) == {"worker-2"} and second["recoverySeconds"] >= 0
    got = scrape(metrics.url)
    assert got[("flextrain_recovery_seconds_count", ())] == 1
    assert got[("flextrain_join_seconds_count", ())] == 1  # worker-2; the first round's workers did not join a job
    assert got[("flextrain_rendezvous_rounds_total", ())] == 2
    assert got[("flextrain_workers", (("state", "active"),))] == 2
    assert sum(v for (name, labels), v in got.items() if name == "flextrain_relaunches_total") == 1


def test_parameter_server_traffic_and_evaluations_are_exported():
    metrics = JobMetrics()
    metrics({"name": "j", "phase": "Running", "step": 3, "progress": {"recordsDone": 30}, "samplesPerSecond": 5.0,
             "epoch": 1, "metrics": {"loss": "nan"}, "workers": {"desired": 1, "active": 1}, "rounds": 0,
             "evaluations": [{"step": 2, "metrics": {"accuracy": 0.5, "auc": "inf"}, "samples": 10}],
             "psTraffic": {"pushes": 4, "pushSeconds": 0.2, "pushBytes": 400, "pulls": 2, "pullSeconds": 0.1,
                           "pullBytes": 800}})
    metrics.serve(host="127.0.0.1", port=0)
    try:
        got = scrape(metrics.url)
    finally:
        metrics.close()
    assert got[("flextrain_ps_push_seconds_count", ())] == 4 and got[("flextrain_ps_push_seconds_sum", ())] == 0.2
    assert got[("flextrain_ps_pull_bytes_total", ())] == 800
    assert got[("flextrain_evaluation", (("metric", "accuracy"),))] == 0.5
    assert got[("flextrain_evaluation", (("metric", "auc"),))] == float("inf")
    assert got[("flextrain_evaluation_step", ())] == 2
    nan = got[("flextrain_loss", ())]
    assert nan != nan  # a NaN loss is shown as NaN, not dropped


def test_no_metrics_and_a_busy_port_leave_the_job_without_an_endpoint(tmp_path):
    off = JobSpec.of(name="j", model_def="m.py", training_data="d", job_dir=str(tmp_path), metrics=False).validate()
    assert start_metrics(off, host="127.0.0.1") is None
    first = JobMetrics()
    first.serve(host="127.0.0.1", port=0)
    try:
        port = int(first.url.rsplit(":", 1)[1].split("/")[0])
        busy = JobSpec.of(name="j", model_def="m.py", training_data="d", job_dir=str(tmp_path),
                          metrics_port=port).validate()
        notes = []
        assert start_metrics(busy, host="127.0.0.1", note=notes.append) is None
        assert notes and f"cannot listen on 127.0.0.1:{port}" in notes[0] and "--metrics-port" in notes[0]
    finally:
        first.close()
