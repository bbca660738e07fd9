"""A local worker over --worker-memory-limit is killed as OOMKilled and the job goes on with half the
micro-batch, G unchanged, every record applied exactly once (the counting model holds memory in
proportion to its micro-batch: FT_BYTES_PER_SAMPLE); at micro-batch 1 the job fails saying so."""

from __future__ import annotations

import os
import subprocess

import pytest

from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, seen_counts

pytestmark = pytest.mark.e2e

G = 32
MiB = 1 << 20


def run_job(data, job_dir, *flags, per_sample: int):
    return subprocess.run(
        flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size",
                      str(G), "--lr", "0.05", "--job-dir", str(job_dir), *flags),
        capture_output=True, text=True, timeout=400,
        env={**os.environ, "FT_COUNT_G": str(G), "FT_BYTES_PER_SAMPLE": str(per_sample)})


def test_worker_over_its_memory_limit_is_replanned_with_half_the_micro_batch(digits_data, tmp_path):
    # A worker holds ~340 MiB before any sample: at M=16 it holds 640 MiB more (over 900 MiB), at M=8 320 MiB.
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    epochs = 3
    done = run_job(data, job_dir, "--workers", "2", "--epochs", str(epochs), "--max-micro-batch", "16",
                   "--worker-memory-limit", "900MiB", per_sample=40 * MiB)
    assert done.returncode == 0, done.stderr[-3000:]
    status = read_status(job_dir)
    rounds = status["roundHistory"]
    assert rounds[0]["maxMicroBatch"] == 16 and rounds[-1]["maxMicroBatch"] == 8
    assert {r["maxMicroBatch"] for r in rounds} == {16, 8}  # halved once, though both workers were killed
    actions = status["maxMicroBatchChoice"]["outOfMemory"]
    assert actions[0]["maxMicroBatch"] == 16 and "micro-batch 16 -> 8, the global batch unchanged" in actions[0]["action"]
    assert any("OOMKilled" in e and "16 -> 8" in e for e in status["events"])
    seen, version = seen_counts(job_dir)
    assert version == epochs * 1408 // G  # G unchanged: as many steps as without the kills
    assert seen.min().item() == seen.max().item() == epochs


def test_out_of_memory_at_micro_batch_one_fails_the_job_with_that_reason(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    done = run_job(data, job_dir, "--workers", "1", "--epochs", "1", "--max-micro-batch", "1",
                   "--worker-memory-limit", "600MiB", per_sample=400 * MiB)
    assert done.returncode != 0
    status = read_status(job_dir)
    assert status["phase"] == "Failed"
    assert "OOMKilled (out of memory) at the smallest micro-batch 1" in status["message"]
    assert status["failure"]["reason"] == "OOMKilled"
    assert "OOMKilled" in done.stderr
    # The killed lone worker had no peer to remove its alive mark (flextrain/worker/peerwatch.py): the
    # launcher that reaped it did.
    pids = {m["pid"] for r in status["roundHistory"] for m in r["members"]}
    assert pids and not [p for p in os.listdir("/dev/shm") if any(p.startswith(f"flextrain-alive-{pid}-") for pid in pids)]
