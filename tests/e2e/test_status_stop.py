"""`flextrain status` and `flextrain stop` against a running job."""

from __future__ import annotations

import json
import subprocess

import pytest

from ft_helpers import DIGITS_MODEL, flextrain_cmd, read_status, run_flextrain, wait_for

pytestmark = pytest.mark.e2e


def test_status_then_stop_a_running_job(digits_data, tmp_path):
    job_dir = tmp_path / "long-job"
    proc = subprocess.Popen(
        flextrain_cmd("train", "--model-def", DIGITS_MODEL, "--training-data", str(digits_data / "train"),
                      "--workers", "2", "--epochs", "500", "--global-batch-size", "32", "--job-dir", str(job_dir)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: (job_dir / "status.json").exists() and read_status(job_dir)["progress"]["recordsDone"] > 0,
                 timeout=120, what="training progress")
        out = run_flextrain("status", str(job_dir), "--json")
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert status["phase"] == "Running" and (status["workers"]["desired"], status["workers"]["active"]) == (2, 2)
        human = run_flextrain("status", str(job_dir))
        assert "phase     Running" in human.stdout and "records" in human.stdout

        stop = run_flextrain("stop", str(job_dir))
        assert stop.returncode == 0, stop.stderr
        assert proc.wait(timeout=60) == 1  # a stopped job did not succeed
    finally:
        proc.kill()
    status = read_status(job_dir)
    assert status["phase"] == "Failed" and "stopped" in status["message"]
    assert 0 < status["progress"]["recordsDone"] < status["progress"]["recordsTotal"]
    again = run_flextrain("stop", str(job_dir))
    assert again.returncode == 2 and "not running" in again.stderr
