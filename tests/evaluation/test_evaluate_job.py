"""`flextrain evaluate`: an evaluation-only job over real worker processes."""

from __future__ import annotations

import json

import pytest

from evalcases import STEPCOUNT, stepcount_checkpoint
from ft_helpers import read_status, run_flextrain

pytestmark = pytest.mark.e2e


def test_evaluation_only_job_reports_exact_metrics(tmp_path, validation):
    ckpt = stepcount_checkpoint(tmp_path / "model.ckpt", version=7)
    job_dir = tmp_path / "eval-job"
    # 100 records in tasks of 2 x 10 records: 3 + 2 tasks over the two files, two workers.
    proc = run_flextrain(
        "evaluate", "--model-def", STEPCOUNT, "--validation-data", str(validation), "--checkpoint", str(ckpt),
        "--workers", "2", "--global-batch-size", "10", "--steps-per-task", "2", "--max-micro-batch", "4",
        "--job-dir", str(job_dir),
    )
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    expected = {"step": 7.0, "x": 49.5, "accuracy": 0.8}
    assert status["metrics"] == expected
    assert [(e["step"], e["samples"], e["metrics"]) for e in status["evaluations"]] == [(7, 100, expected)]
    assert "evaluation at step 7" in status["message"]
    assert "accuracy: 0.8000" in proc.stderr  # the closing summary
    assert json.loads((job_dir / "jobspec.json").read_text())["job_type"] == "evaluation"


def test_checkpoint_given_as_a_training_job_directory(tmp_path, validation):
    job = tmp_path / "trained"
    stepcount_checkpoint(job / "checkpoints" / "ckpt-000000003.ckpt", version=3)
    (job / "checkpoints" / "latest.json").write_text(json.dumps(
        {"checkpoint": str(job / "checkpoints" / "ckpt-000000003.ckpt"), "version": 3, "final": False,
         "ledger": "unused"}))
    job_dir = tmp_path / "eval-job"
    proc = run_flextrain("evaluate", "--model-def", STEPCOUNT, "--validation-data", str(validation),
                         "--checkpoint", str(job), "--job-dir", str(job_dir))
    assert proc.returncode == 0, proc.stderr
    assert read_status(job_dir)["metrics"]["step"] == 3.0
