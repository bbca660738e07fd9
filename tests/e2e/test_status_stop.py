"""`flextrain status` and `flextrain stop` against a running job (the session's stopped job,
tests/e2e/conftest.py)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def test_status_then_stop_a_running_job(stopped_counting_job):
    job = stopped_counting_job
    assert job.as_json.returncode == 0, job.as_json.stderr
    status = json.loads(job.as_json.stdout)
    assert status["phase"] == "Running" and (status["workers"]["desired"], status["workers"]["active"]) == (2, 2)
    assert "phase     Running" in job.human.stdout and "records" in job.human.stdout

    assert job.stop.returncode == 0, job.stop.stderr
    assert job.code == 1, job.err  # a stopped job did not succeed
    status = job.stopped
    assert status["phase"] == "Failed" and "stopped" in status["message"]
    assert 0 < status["progress"]["recordsDone"] < status["progress"]["recordsTotal"]
    assert job.again.returncode == 2 and "not running" in job.again.stderr
