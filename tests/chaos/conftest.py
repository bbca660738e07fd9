"""Fixtures of the chaos suite: the counting data (written once) and jobs that never outlive a test."""

from __future__ import annotations

import subprocess

import pytest

from chaos_support import RECORDS, ChaosJob
from ft_helpers import counting_data


@pytest.fixture(scope="session")
def counting_records(digits_data, tmp_path_factory):
    return counting_data(digits_data, tmp_path_factory.mktemp("counting"), records=RECORDS)


@pytest.fixture
def chaos_job(tmp_path):
    """``chaos_job(args, env=..., seed=...)`` starts a ChaosJob in ``tmp_path / "job"``; a job still
    running when the test ends is stopped (SIGTERM: the master takes its workers down), then killed."""
    jobs: list[ChaosJob] = []

    def start(args: list[str], *, env: dict[str, str], seed: int) -> ChaosJob:
        jobs.append(ChaosJob(tmp_path / "job", args, env={"FT_COUNT_RECORDS": str(RECORDS), **env}, seed=seed))
        return jobs[-1]

    yield start
    for job in jobs:
        if job.proc.poll() is None:
            job.proc.terminate()
            try:
                job.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
