"""Only rank 0 of an AllReduce round asks the master for training tasks; the other members get each
answer from it over the round's process group (flextrain/worker/round_tasks.py). The master counts
every worker's training-task GetTask calls (status.json ``taskAsks``); the counting model counts how
often each record reached a committed step."""

from __future__ import annotations

import os
import subprocess

import pytest

from ft_helpers import (COUNTING_MODEL, counted_exactly_once_through_a_kill, counting_data, flextrain_cmd,
                        read_status, seen_counts)

pytestmark = pytest.mark.e2e

G = 32


def rank0_ids(status: dict) -> set[str]:
    """Every worker that was rank 0 of some round."""
    return {r["members"][0]["id"] for r in status["roundHistory"]}


def test_only_rank0_of_a_round_asks_for_training_tasks(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    epochs = 3
    cmd = flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size",
                        str(G), "--max-micro-batch", "8", "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "3",
                        "--epochs", str(epochs), "--steps-per-task", "2")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "FT_COUNT_G": str(G)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = read_status(job_dir)
    members = {m["id"] for r in status["roundHistory"] for m in r["members"]}
    assert len(members) == 3
    asks = status["taskAsks"]
    # rank 0 asked (ahead or plainly) for every task of the job; no other member asked even once
    assert asks and set(asks) <= rank0_ids(status), (asks, status["roundHistory"])
    assert members - rank0_ids(status), "some member was never rank 0"
    seen, version = seen_counts(job_dir)
    assert version == epochs * 1408 // G
    assert seen.min().item() == seen.max().item() == epochs


def test_rank0_killed_mid_task_the_round_reforms_and_every_record_is_applied_once(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    final = counted_exactly_once_through_a_kill(COUNTING_MODEL, str(data), tmp_path / "job", epochs=3, victim_rank=0)
    first = next(r for r in final["roundHistory"] if len(r["members"]) == 3)
    victim = first["members"][0]["id"]
    after = [r for r in final["roundHistory"] if r["round"] > first["round"]]
    asks = final["taskAsks"]
    # the killed rank 0 asked for the first round; a survivor became rank 0 and asked for the next ones
    assert victim in asks and any(r["members"][0]["id"] in asks for r in after), (asks, final["roundHistory"])
    assert set(asks) <= rank0_ids(final), (asks, final["roundHistory"])
