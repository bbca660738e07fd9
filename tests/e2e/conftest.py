"""Jobs more than one e2e test reads (run once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ft_helpers import DIGITS_MODEL, run_flextrain


@pytest.fixture(scope="session")
def digits_fixed_g(digits_data, tmp_path_factory):
    """The digits model trained by two workers at a fixed G = 64 for 6 epochs: (job dir, process).

    The bar of tests/e2e/test_training_job.py, and the fixed-G accuracy an adaptive G must reach."""
    job_dir: Path = tmp_path_factory.mktemp("digits-fixed-g") / "job"
    proc = run_flextrain(
        "train", "--model-def", DIGITS_MODEL, "--training-data", str(digits_data / "train"),
        "--validation-data", str(digits_data / "validation"), "--workers", "2", "--epochs", "6",
        "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1", "--job-dir", str(job_dir),
    )
    return job_dir, proc
