"""`flextrain suspend` and `flextrain resume` of a running local job: every worker process released,
the master waiting in phase Suspended, and after the resume each record applied exactly once
(the counting model, tests/e2e/zoo/counting_digits.py)."""

from __future__ import annotations

import os
import subprocess

import pytest

from ft_helpers import (COUNTING_MODEL, counting_data, flextrain_cmd, processes_with_args, read_status, run_flextrain,
                        seen_counts, wait_for)

pytestmark = pytest.mark.e2e

G = 32


def test_suspend_releases_every_worker_and_resume_finishes_exactly_once(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    # The stand-in compute (0.05 s a feed: >= 0.1 s a step) keeps the job from ending before the suspend
    # lands; it is lifted once the suspend is checked (FT_FEED_DELAY_UNTIL): the resumed job trains at full speed.
    epochs, calm = 10, tmp_path / "suspended"
    proc = subprocess.Popen(
        flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--workers", "2",
                      "--epochs", str(epochs), "--global-batch-size", str(G), "--max-micro-batch", "8", "--lr", "0.05",
                      "--job-dir", str(job_dir)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FT_COUNT_G": str(G), "FT_FEED_DELAY": "0.05", "FT_FEED_DELAY_UNTIL": str(calm)})
    try:
        wait_for(lambda: (job_dir / "status.json").exists() and read_status(job_dir)["step"] > 5, timeout=180,
                 what="training progress")
        suspended = run_flextrain("suspend", str(job_dir))
        assert suspended.returncode == 0, suspended.stderr
        status = wait_for(lambda: (s := read_status(job_dir))["phase"] == "Suspended" and s, timeout=120,
                          what="phase Suspended")
        assert status["workers"]["active"] == 0 and "suspended" in status["message"]
        assert "suspending: suspended by user (flextrain suspend)" in status["events"], status["events"]
        assert processes_with_args("worker", "--master", status["masterAddress"]) == []
        assert (job_dir / "checkpoints" / "latest.json").exists()  # the suspend checkpoint
        step = status["step"]
        assert 0 < step < epochs * 1408 // G
        assert proc.poll() is None  # the master waits for the resume
        calm.touch()

        again = run_flextrain("suspend", str(job_dir))
        assert again.returncode != 0 and "already Suspended" in again.stderr
        resumed = run_flextrain("resume", str(job_dir))
        assert resumed.returncode == 0, resumed.stderr
        # Running again; without the stand-in compute the rest may train in less than a poll: Succeeded too.
        wait_for(lambda: read_status(job_dir)["phase"] in ("Running", "Succeeded"), timeout=120,
                 what="phase Running again")
        out, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    final = read_status(job_dir)
    assert final["phase"] == "Succeeded"
    seen, version = seen_counts(job_dir)
    assert version == epochs * 1408 // G
    assert seen.min().item() == seen.max().item() == epochs
    late = run_flextrain("resume", str(job_dir))
    assert late.returncode != 0 and "not running" in late.stderr
    assert f"run `flextrain train --resume {job_dir}`" in late.stderr  # what continues an ended job
