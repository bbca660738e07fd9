"""Jobs more than one e2e test reads (run once per session)."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest

from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, run_flextrain, wait_for


@pytest.fixture(scope="session")
def stopped_counting_job(digits_data, tmp_path_factory):
    """The counting model (G = 32) trained by 2 workers for 10 epochs, asked for its status (``as_json``,
    ``human``) once 10% is done, then stopped (``stop``; the job's ``code`` and stderr ``err``, and its
    ``stopped`` status), then stopped ``again``. The stand-in compute (FT_FEED_DELAY, 0.05 s a feed: >= 0.1 s
    a step) keeps it from ending before the stop lands.

    tests/e2e/test_status_stop.py reads the commands' outputs; test_elastic.py resumes the job (so a test
    reads ``stopped``, not the job's status.json, for the stopped state)."""
    tmp = tmp_path_factory.mktemp("stopped")
    data = counting_data(digits_data, tmp / "data")
    job_dir = tmp / "job"
    proc = subprocess.Popen(
        flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size", "32",
                      "--max-micro-batch", "8", "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "2",
                      "--epochs", "10", "--checkpoint-steps", "10"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FT_COUNT_G": "32", "FT_FEED_DELAY": "0.05"})
    try:
        wait_for(lambda: (job_dir / "status.json").exists() and read_status(job_dir)["progress"]["percent"] > 10,
                 timeout=120, what="10% progress")
        as_json, human = run_flextrain("status", str(job_dir), "--json"), run_flextrain("status", str(job_dir))
        stop = run_flextrain("stop", str(job_dir))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return SimpleNamespace(data=data, job_dir=job_dir, epochs=10, as_json=as_json, human=human, stop=stop,
                           code=proc.returncode, err=err, stopped=read_status(job_dir),
                           again=run_flextrain("stop", str(job_dir)))
