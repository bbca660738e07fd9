"""`flextrain status JOB --watch` on a local job: it refreshes until the job ends, then exits showing
the final phase."""

from __future__ import annotations

import os
import subprocess

import pytest

from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, run_flextrain, wait_for

pytestmark = pytest.mark.e2e


def test_watch_exits_when_the_job_ends_showing_its_final_phase(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data", records=640)
    job_dir = tmp_path / "job"
    env = {**os.environ, "FT_COUNT_G": "32"}
    job = subprocess.Popen(flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data),
                                         "--global-batch-size", "32", "--max-micro-batch", "8", "--lr", "0.05",
                                         "--job-dir", str(job_dir), "--epochs", "3", "--no-tensorboard"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(lambda: (job_dir / "status.json").exists() and read_status(job_dir)["phase"] in ("Pending", "Running"),
                 timeout=120, what="the job's first status")
        watched = run_flextrain("status", str(job_dir), "--watch", timeout=300)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 0, err
    assert watched.returncode == 0, watched.stderr
    # piped (not a terminal): the summary each time it changed, blocks apart, the last one the job's end
    blocks = watched.stdout.split("\n\n")
    assert watched.stdout.endswith("\n") and len(blocks) == len(set(blocks)), watched.stdout
    assert "phase     Succeeded  - training finished" in blocks[-1]
    assert "progress  1,920/1,920 records (100.0%)" in blocks[-1]
    assert not (job_dir / "tensorboard").exists()  # --no-tensorboard
    assert (job_dir / "events.jsonl").exists()  # the history is recorded all the same
