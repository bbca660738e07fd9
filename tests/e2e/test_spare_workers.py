"""Warm spares (--spare-workers): a scale-up and the replacement of a killed worker each take the parked
spare (its very process joins the next round) and a new spare is started behind it; spares never count
as workers; every record is still applied exactly once; no spare outlives the job."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from ft_helpers import (COUNTING_MODEL, alive, assert_exactly_once_at_latest_checkpoint, counting_data,
                        flextrain_cmd, read_status, run_flextrain, scrape, wait_for)

pytestmark = pytest.mark.e2e

G = 32


def test_scale_up_and_a_kill_each_take_the_parked_spare(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    proc = subprocess.Popen(
        flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size",
                      str(G), "--max-micro-batch", "8", "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "2",
                      "--min-workers", "1", "--max-workers", "3", "--spare-workers", "1", "--epochs", "1000"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "FT_COUNT_G": str(G)})

    def status():
        s = read_status(job_dir) if (job_dir / "status.json").exists() else None
        return s if s and s["phase"] == "Running" else None

    def parked_spare(but=()):
        """The pid of the one parked spare, once one other than ``but`` has parked."""
        s = status()
        pids = s["spares"]["pids"] if s else []
        return pids[0] if len(pids) == 1 and pids[0] not in but else None

    def round_with(pid, size):
        """The latest round, once it has ``size`` members, ``pid`` among them, and has trained a little."""
        s = status()
        rnd = s["roundHistory"][-1] if s and s["roundHistory"] else None
        members = {m["pid"] for m in s["members"]} if s else set()
        return rnd if (rnd and len(rnd["members"]) == size and pid in members and s["step"] > rnd["version"] + 3
                       and s["workers"]["active"] == size) else None

    try:
        first_spare = wait_for(parked_spare, timeout=120, what="the spare parked")
        s = wait_for(lambda: (s := status()) and len(s["members"]) == 2 and s["step"] > 5 and s,
                     timeout=120, what="2 workers training")
        assert first_spare not in {m["pid"] for m in s["members"]}
        assert (s["workers"]["desired"], s["workers"]["active"]) == (2, 2)  # the spare is not a worker
        shown = run_flextrain("status", str(job_dir)).stdout
        assert "workers   2 active / 2 desired" in shown and "spares    1 parked, 0 starting / 1 wanted" in shown

        assert run_flextrain("scale", str(job_dir), "3").returncode == 0
        scaled = wait_for(lambda: round_with(first_spare, 3), timeout=120, what="the spare joining on scale-up")
        second_spare = wait_for(lambda: parked_spare(but=(first_spare,)), timeout=120, what="a new spare")
        assert status()["spares"]["taken"] == 1

        victim = next(m for m in status()["members"] if m["pid"] != first_spare)
        os.kill(victim["pid"], signal.SIGKILL)
        replaced = wait_for(lambda: (r := round_with(second_spare, 3)) and r["round"] > scaled["round"] and r,
                            timeout=120, what="the second spare replacing the killed worker")
        assert victim["id"] not in {m["id"] for m in replaced["members"]}
        third_spare = wait_for(lambda: parked_spare(but=(first_spare, second_spare)), timeout=120,
                               what="a spare behind the replacement")
        assert status()["spares"]["taken"] == 2
        # Prometheus sees the same: scraped from the master and parsed (flextrain/master/metrics.py).
        metrics = scrape(status()["metricsUrl"])
        assert metrics[("flextrain_workers", (("state", "active"),))] == 3
        assert metrics[("flextrain_workers", (("state", "spare"),))] == 1
        assert metrics[("flextrain_join_seconds_count", ())] >= 2  # the scale-up's spare and the replacement
        assert metrics[("flextrain_recovery_seconds_count", ())] >= 1  # the kill
        assert metrics[("flextrain_step", ())] > 0 and metrics[("flextrain_samples_total", ())] > 0

        assert run_flextrain("stop", str(job_dir)).returncode == 0
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "resume with" in read_status(job_dir)["message"], err
    assert_exactly_once_at_latest_checkpoint(job_dir, G=G)
    # No orphans: the spare still parked at the end exited with the job (its master closed the pool).
    wait_for(lambda: not alive(third_spare), timeout=30, what="the last spare exiting")
