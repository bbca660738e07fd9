"""Evaluation every --evaluation-steps during AllReduce training: real master and worker processes."""

from __future__ import annotations

import pytest

from evalcases import STEPCOUNT, write_csv
from ft_helpers import read_status, run_flextrain
from flextrain.elastic.statecodec import decode

pytestmark = pytest.mark.e2e


def test_every_n_steps_evaluates_the_model_of_that_step(tmp_path, validation):
    train = write_csv(tmp_path / "train" / "part.csv", range(640))
    job_dir = tmp_path / "job"
    # G=32: 20 steps in tasks of 8, 8 and 4 steps; every 5 steps -> 5 and 15 fall inside a task.
    proc = run_flextrain(
        "train", "--model-def", STEPCOUNT, "--training-data", str(train.parent),
        "--validation-data", str(validation), "--workers", "2", "--global-batch-size", "32",
        "--max-micro-batch", "12", "--evaluation-steps", "5", "--job-dir", str(job_dir),
    )
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == 640  # training stayed exactly-once
    # The model of version v has b == -v, so metric "step" names the model each evaluation saw.
    # The final evaluation (step 20) was already done by the last periodic one: not repeated.
    assert [e["step"] for e in status["evaluations"]] == [5, 10, 15, 20]
    for e in status["evaluations"]:
        assert e["samples"] == 100
        assert e["metrics"] == {"step": float(e["step"]), "x": 49.5, "accuracy": 0.8}
    assert status["metrics"]["step"] == 20.0 and status["metrics"]["accuracy"] == 0.8
    final = decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())
    assert final["version"] == 20 and float(final["model"]["b"]) == -20.0
    for step in (5, 10, 15, 20):  # the terminal shows each evaluation as it completes
        assert f"evaluation at step {step}: accuracy 0.8000  step {step}.0000  x 49.5000" in proc.stderr


def test_worker_killed_mid_evaluation(tmp_path, validation, monkeypatch):
    """Its evaluation task goes to the survivor; the evaluation and exactly-once training both hold."""
    import os
    import signal
    import subprocess

    from ft_helpers import flextrain_cmd, wait_for

    train = write_csv(tmp_path / "train" / "part.csv", range(640))
    gate = tmp_path / "gate"
    monkeypatch.setenv("STEPCOUNT_EVAL_GATE", str(gate))
    job_dir = tmp_path / "job"
    proc = subprocess.Popen(flextrain_cmd(
        "train", "--model-def", STEPCOUNT, "--training-data", str(train.parent),
        "--validation-data", str(validation), "--workers", "2", "--global-batch-size", "32",
        "--evaluation-steps", "5", "--job-dir", str(job_dir), "--no-progress",
        "--no-preflight",  # preflight's evaluation would wait at the gate too
    ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the validation data is two files: two evaluation tasks, one held by each member
        def evaluating():
            found = sorted(tmp_path.glob("gate.[0-9]*"))  # gate.<pid>, written inside feed
            return found if len(found) == 2 else None

        holders = wait_for(evaluating, timeout=120, what="both members evaluating step 5")
        victim = int(holders[0].name.split(".")[1])
        os.kill(victim, signal.SIGKILL)
        gate.with_name("gate.release").touch()
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == 640
    assert [e["step"] for e in status["evaluations"]] == [5, 10, 15, 20]
    for e in status["evaluations"]:
        assert (e["samples"], e["metrics"]) == (100, {"step": float(e["step"]), "x": 49.5, "accuracy": 0.8})
    final = decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())
    assert final["version"] == 20 and float(final["model"]["b"]) == -20.0  # no step applied twice or lost
    assert victim not in [m["pid"] for r in status["roundHistory"][1:] for m in r["members"]]
