"""Chaos, AllReduce: repeated SIGKILLs of random workers (rank 0 once) and scale-ups while a
counting model trains, in float32 and in other dtypes; the job still succeeds and every record
was applied exactly once per epoch (tests/e2e/zoo/counting_digits.py counts in the model)."""

from __future__ import annotations

import pytest
import torch

from chaos_support import RECORDS
from ft_helpers import COUNTING_MODEL, read_status, seen_counts

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

G, EPOCHS = 32, 50


# mixed: a float32 body with a float64 head and counter (two buffers, reduced side by side)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "mixed"])
def test_every_record_once_per_epoch_under_kills_and_scale_ups(counting_records, chaos_job, dtype):
    job = chaos_job(["--model-def", COUNTING_MODEL, "--training-data", str(counting_records),
                     "--global-batch-size", str(G), "--max-micro-batch", "8", "--lr", "0.05",
                     "--epochs", str(EPOCHS), "--workers", "2", "--min-workers", "1", "--max-workers", "4",
                     "--steps-per-task", "4", "--relaunch-budget", "20"],
                    env={"FT_COUNT_G": str(G), "FT_COUNT_DTYPE": dtype, "FT_FEED_DELAY": "0.1"},
                    seed=sum(dtype.encode()))
    # each event waits for the one before to have taken effect: a newcomer training in a round
    job.kill_member()
    job.scale_round(3)
    job.kill_member(rank=0)  # the member that broadcasts the state to newcomers
    job.scale_round(4)
    job.kill_member()
    code, out = job.finish()
    assert code == 0, out[-3000:]

    status = read_status(job.job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == EPOCHS * RECORDS
    members = [m for r in status["roundHistory"] for m in r["members"]]
    assert len(job.kills) == 3 and {m["id"] for m in members} >= set(job.kills)
    assert len({m["id"] for m in members}) == 2 + 2 + 3  # two first, two by scaling, three replacements
    assert max(len(r["members"]) for r in status["roundHistory"]) == 4

    seen, version = seen_counts(job.job_dir)
    assert version == EPOCHS * RECORDS // G
    assert seen.dtype == (torch.float64 if dtype == "mixed" else getattr(torch, dtype))
    assert seen.double().tolist() == [float(EPOCHS)] * RECORDS  # every record, once per epoch
