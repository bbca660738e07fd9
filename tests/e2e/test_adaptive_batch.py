"""``--batch-schedule adaptive`` (docs/batch-schedules.md, "Adaptive global batch (jobs)"): the master
chooses G every N steps from the gradient noise scale the workers measure; G grows within its bounds,
every decision is in status.json's ``batchHistory``, the workers' steps follow it, a stop and
``--resume`` continue from the decisions persisted with the checkpoint, and every record is trained
exactly once per epoch."""

from __future__ import annotations

import bisect
import os
import re

import pytest

from ft_helpers import (COUNTING_MODEL, DIGITS_MODEL, counting_data, finish, read_status, run_flextrain, seen_counts,
                        wait_for)
from test_batch_schedule import resume, train

pytestmark = pytest.mark.e2e

LO, HI, EVERY = 16, 64, 10
ADA_LINE = re.compile(r"from step (\d+): global batch (\d+), adascale rule: gain so far ([\d.e+-]+),")


def g_at(history, step):
    return history[bisect.bisect_right([s for s, _ in history], step) - 1][1]


def test_adaptive_g_grows_within_bounds_through_stop_and_resume(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    env = {**os.environ, "FT_COUNT_G": "any", "FT_FEED_DELAY": "0.1", "FLEXTRAIN_LOG_LEVEL": "INFO"}
    proc = train("--model-def", COUNTING_MODEL, "--training-data", str(data), "--batch-schedule", "adaptive",
                 "--min-global-batch", str(LO), "--max-global-batch", str(HI), "--adapt-every", str(EVERY),
                 "--lr", "0.05", "--max-micro-batch", "16", "--epochs", "3", "--workers", "2",
                 "--checkpoint-steps", "5", "--steps-per-task", "4", "--no-progress", "--job-dir", str(job_dir),
                 env=env)
    try:
        def running():
            s = read_status(job_dir) if (job_dir / "status.json").exists() else None
            return s if s and s["phase"] == "Running" and s["roundHistory"] else None

        s = wait_for(lambda: (s := running()) and len(s["batchHistory"]) >= 3 and s["step"] >= 25 and s,
                     timeout=240, what="three decisions")
        assert s["lrRule"] == "adascale" and s["globalBatchSize"] == g_at(s["batchHistory"], s["step"])
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1 and "resume with" in read_status(job_dir)["message"], err
    before = read_status(job_dir)
    stopped = before["step"]

    code, err = finish(resume(job_dir, env))
    assert code == 0, err
    final = read_status(job_dir)
    history = [tuple(d) for d in final["batchHistory"]]
    seen, version = seen_counts(job_dir)
    assert set(seen.tolist()) == {3.0}, "every record trained exactly once per epoch"
    assert version == final["step"]

    # Decisions: at multiples of EVERY, each G a multiple of the min within the bounds, G grew.
    assert history[0] == (0, LO) and all(s % EVERY == 0 for s, _ in history), history
    assert all(LO <= g <= HI and g % LO == 0 for _, g in history), history
    assert max(g for _, g in history) > LO, f"G never grew: {history}"
    # The resumed job went on from the decisions persisted with its checkpoint (up to the stop's step).
    kept = [tuple(d) for d in before["batchHistory"] if d[0] <= stopped]
    assert history[:len(kept)] == kept, (kept, history)
    assert final["globalBatchSize"] == g_at(history, final["step"])

    # Each worker's steps followed the decisions: the G it logs at a change is the decided G of that step.
    lines = [(int(m[1]), int(m[2])) for log in (job_dir / "logs").rglob("*.log")
             for m in ADA_LINE.finditer(log.read_text())]
    assert lines and all(g == g_at(history, step) for step, g in lines), (lines, history)


def test_adaptive_digits_reach_the_accuracy_of_a_fixed_batch(digits_data, digits_fixed_g, tmp_path):
    """The digits model with G chosen per epoch in [32, 256] (LR: 0.1 × AdaScale's gain against 32)
    reaches the accuracy of the same model trained at a fixed G = 64, LR 0.1 (the session's run of
    test_training_job), within 0.02 (one run each: seeds differ), and the 0.90 bar."""
    job_dir = tmp_path / "job"
    proc = run_flextrain(
        "train", "--model-def", DIGITS_MODEL, "--training-data", str(digits_data / "train"),
        "--validation-data", str(digits_data / "validation"), "--workers", "2", "--epochs", "6",
        "--batch-schedule", "adaptive", "--min-global-batch", "32", "--max-global-batch", "256",
        "--max-micro-batch", "32", "--lr", "0.1", "--no-progress", "--job-dir", str(job_dir))
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 6 * 1438
    history = status["batchHistory"]
    assert len(history) == 6 and history[0] == [0, 32] and all(32 <= g <= 256 for _, g in history), history
    assert max(g for _, g in history) > 32, f"G never grew: {history}"  # the noise scale is ~50-80 here
    fixed_dir, fixed_proc = digits_fixed_g
    assert fixed_proc.returncode == 0, fixed_proc.stderr[-3000:]
    fixed = read_status(fixed_dir)["metrics"]["accuracy"]
    assert status["metrics"]["accuracy"] >= fixed - 0.02, (status["metrics"], fixed, history)
    assert status["metrics"]["accuracy"] > 0.90, (status["metrics"], history)
