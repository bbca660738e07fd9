"""`flextrain status` of a job not there yet (--watch waits for it) and of an ended job or a dead master
(no metrics URL: nothing serves it any more). In process: status.json written by hand or by a real
StatusReporter, no job run."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types

import pytest

from flextrain.cli import jobs
from flextrain.cli.common import CLIError


def _status(job_dir, *, phase="Running", pid=None, metrics_url="http://127.0.0.1:40947/metrics") -> dict:
    return {"name": "job", "phase": phase, "message": "", "jobDir": str(job_dir), "epoch": 1, "epochs": 1, "step": 3,
            "metrics": {}, "workers": {"active": 1, "desired": 1}, "pid": pid,
            "progress": {"recordsDone": 30, "recordsTotal": 40, "percent": 75.0}, "metricsUrl": metrics_url}


def _args(job_dir, *, watch=False, as_json=False):
    return argparse.Namespace(job=str(job_dir), watch=watch, json=as_json)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_watch_waits_for_a_job_whose_status_is_not_written_yet(tmp_path, monkeypatch, capsys):
    job_dir = tmp_path / "job"
    sleeps = []

    def sleep(seconds):  # the job's master writes its first status while the command waits
        sleeps.append(seconds)
        if len(sleeps) == 3:
            job_dir.mkdir()
            (job_dir / "status.json").write_text(json.dumps(_status(job_dir, phase="Succeeded")))

    monkeypatch.setattr(jobs, "time", types.SimpleNamespace(sleep=sleep))
    assert jobs.cmd_status(_args(job_dir, watch=True)) == 0
    out, err = capsys.readouterr()
    assert err.count("waiting for") == 1 and f"{job_dir / 'status.json'}" in err and len(sleeps) == 3
    assert "phase     Succeeded" in out


def test_without_watch_a_missing_job_is_an_error(tmp_path):
    with pytest.raises(CLIError, match="no job .*does not exist|no job .*neither"):
        jobs.cmd_status(_args(tmp_path / "job"))


def test_a_dead_masters_metrics_url_is_not_shown(tmp_path, capsys):
    (tmp_path / "status.json").write_text(json.dumps(_status(tmp_path, pid=_dead_pid())))
    assert jobs.cmd_status(_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "is gone" in out and "metrics " not in out and "40947" not in out
    assert jobs.cmd_status(_args(tmp_path, as_json=True)) == 0
    assert "metricsUrl" not in json.loads(capsys.readouterr().out)


def test_an_ended_jobs_status_holds_no_metrics_url(tmp_path):
    from flextrain.data import Shard
    from flextrain.job import JobSpec
    from flextrain.master.coordinator import JobMaster, Phase
    from flextrain.master.ledger import TaskLedger
    from flextrain.master.status import StatusReporter

    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=10, tensorboard=False).validate()
    job = JobMaster(spec, TaskLedger(shards=[Shard("s.rio", 0, 40)], epochs=1, global_batch_size=10, steps_per_task=2))
    reporter = StatusReporter(job, path=tmp_path / "status.json", desired=lambda: 1, master_address="127.0.0.1:1",
                              show_progress=False, metrics_url="http://127.0.0.1:40947/metrics")
    assert reporter.update()["metricsUrl"] == "http://127.0.0.1:40947/metrics"
    job.finish(Phase.SUCCEEDED, "training finished")
    assert reporter.update()["metricsUrl"] == ""
    assert json.loads((tmp_path / "status.json").read_text())["metricsUrl"] == ""
    reporter.close()
