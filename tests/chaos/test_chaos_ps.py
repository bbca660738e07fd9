"""Chaos, ParameterServer: repeated SIGKILLs of random workers and of a PS, and scale-ups, while a
counting model trains, in float32 and in other dtypes; the job still succeeds and every record was
applied exactly once per epoch, on every PS (tests/e2e/zoo/counting_ps.py counts on the PS)."""

from __future__ import annotations

import pytest
import torch

from chaos_support import RECORDS
from ft_helpers import REPO, ps_counts, read_status

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

COUNTING_PS = f"{REPO / 'tests' / 'e2e' / 'zoo' / 'counting_ps.py'}:Model"
G, EPOCHS = 32, 40


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_every_record_once_per_epoch_under_kills_and_scale_ups(counting_records, chaos_job, dtype):
    job = chaos_job(["--model-def", COUNTING_PS, "--training-data", str(counting_records),
                     "--distribution-strategy", "ParameterServer", "--ps", "2", "--ps-checkpoint-steps", "20",
                     "--global-batch-size", str(G), "--lr", str(G), "--epochs", str(EPOCHS),
                     "--workers", "2", "--min-workers", "1", "--max-workers", "4", "--steps-per-task", "4",
                     "--relaunch-budget", "20"],
                    env={"FT_COUNT_DTYPE": dtype, "FT_FEED_DELAY": "0.2"}, seed=sum(dtype.encode()))
    # each event waits for the one before to have taken effect: a new worker (or PS) running
    job.kill_worker()
    job.scale_workers(3)
    job.kill_ps(1)
    job.kill_worker()
    job.scale_workers(4)
    job.kill_worker()
    code, out = job.finish()
    assert code == 0, out[-3000:]

    status = read_status(job.job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == EPOCHS * RECORDS
    logs = {p.name for p in (job.job_dir / "logs").glob("worker-*.log")}
    assert len(logs) >= 2 + 2 + 3  # two first, two by scaling, three replacements
    dense, rows = ps_counts(job.job_dir, RECORDS)
    assert dense.dtype == rows.dtype == getattr(torch, dtype)  # the PS keeps the model's dtype
    assert dense.double().tolist() == [float(EPOCHS)] * RECORDS  # every record, once per epoch
    assert rows.double().tolist() == [float(EPOCHS)] * RECORDS
