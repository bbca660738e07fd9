"""Slow workers, real processes: a worker whose forward is slow (tests/e2e/zoo/counting_digits.py's
FT_SLOW_WORKER, a slow node) is found as a straggler and replaced with --straggler-policy replace; with
--node-check a slow worker is kept out before it ever joins and another takes its place. Every record is
still applied exactly once, and neither replacement spends the relaunch budget."""

from __future__ import annotations

import os
import subprocess

import pytest

from ft_helpers import (COUNTING_MODEL, assert_exactly_once_at_latest_checkpoint, counting_data, flextrain_cmd,
                        read_status, run_flextrain, wait_for)

pytestmark = pytest.mark.e2e

G = 32


def start(job_dir, data, *flags, env=()):
    return subprocess.Popen(
        flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size",
                      str(G), "--max-micro-batch", "16", "--lr", "0.05", "--job-dir", str(job_dir),
                      "--epochs", "1000", "--relaunch-budget", "0", "--no-progress", *flags),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FT_COUNT_G": str(G), **dict(env)})


def running(job_dir):
    s = read_status(job_dir) if (job_dir / "status.json").exists() else None
    return s if s and s["phase"] == "Running" else None


def stop_and_check(proc, job_dir):
    assert run_flextrain("stop", str(job_dir)).returncode == 0
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1 and "resume with" in read_status(job_dir)["message"], err
    assert_exactly_once_at_latest_checkpoint(job_dir, G=G)
    return err


def test_a_straggler_is_found_and_replaced_and_training_goes_on(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    # Budget 0: any relaunch charged to it would end the job's relaunching; a replacement is not charged.
    proc = start(job_dir, data, "--workers", "2", "--straggler-policy", "replace", "--straggler-factor", "5",
                 env={"FT_SLOW_WORKER": "worker-1", "FT_SLOW_SECONDS": "0.05"})
    try:
        found = wait_for(lambda: (s := running(job_dir)) and any("worker-1" in e and "is a straggler" in e
                                                                 for e in s["events"]) and s,
                         timeout=180, what="worker-1 found as a straggler")
        event = next(e for e in found["events"] if "is a straggler" in e)
        assert "replacing it" in event and "--straggler-factor 5" in event
        replaced = wait_for(lambda: (s := running(job_dir)) and {m["id"] for m in s["members"]} == {"worker-0", "worker-2"}
                            and s["step"] > s["roundHistory"][-1]["version"] + 3 and s,
                            timeout=180, what="worker-2 training in worker-1's place")
        assert (replaced["workers"]["desired"], replaced["workers"]["active"]) == (2, 2)
        assert not any("relaunch budget" in e for e in replaced["events"])  # nothing was charged to it
        figures = replaced["computePerSample"]
        assert "worker-1" not in figures and not any(f["straggler"] for f in figures.values())
        stop_and_check(proc, job_dir)
    finally:
        proc.kill()


def test_a_failed_node_check_keeps_the_slow_worker_out(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    gate = tmp_path / "gate"
    # worker-1's check is ~160x worker-0's; a factor of 20 keeps worker-2 in even when its check (compute and
    # link) runs on a machine far busier than worker-0's did (a 5x swing was seen under a parallel suite).
    proc = start(job_dir, data, "--workers", "2", "--min-workers", "1", "--node-check", "--straggler-factor", "20",
                 env={"FT_SLOW_WORKER": "worker-1", "FT_SLOW_SECONDS": "0.2", "FT_SLOW_GATE": str(gate)})
    try:
        wait_for(lambda: (s := running(job_dir)) and s["workers"]["active"] >= 1, timeout=180,
                 what="worker-0 training")
        gate.touch()  # only now may the slow worker check its node: worker-0's check is the reference
        s = wait_for(lambda: (s := running(job_dir)) and {m["id"] for m in s["members"]} == {"worker-0", "worker-2"}
                     and s, timeout=180, what="worker-2 joining in the refused worker-1's place")
        refused = [e for e in s["events"] if "kept out of the job" in e]
        # The admitted workers' checks: compute and the all-reduce probe with the master (ProbeLink).
        assert {"worker-0", "worker-2"} <= set(s["nodeChecks"]) and s["nodeChecks"]["worker-0"]["linkMsPerMiB"] > 0
        assert len(refused) == 1 and refused[0].startswith("worker-1 on node ") and "--node-check" in refused[0]
        assert "--straggler-factor 20" in refused[0]
        assert not any("worker-1" in e and "failed" in e for e in s["events"])  # no failure was charged
        log = (job_dir / "logs" / "worker-1.log").read_text()
        assert "leaving, as the master says: worker-1 on node" in log and "kept out of the job" in log
        stop_and_check(proc, job_dir)
    finally:
        proc.kill()
