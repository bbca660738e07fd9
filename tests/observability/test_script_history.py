"""A script job (`flextrain run`) reports its steps and losses into the job's history: the GA optimizer of
examples/elastic_script_torch.py reports through flextrain.elastic.progress, the agents' heartbeats carry
it, and events.jsonl, the TensorBoard files and `flextrain plot` show it, with a scale-up and a kill."""

from __future__ import annotations

import math
import os
import signal
import subprocess

import pytest

from ft_helpers import REPO, flextrain_cmd, read_status, run_flextrain, wait_for

pytestmark = pytest.mark.e2e

SCRIPT = str(REPO / "examples" / "elastic_script_torch.py")
G = 64


def test_a_script_jobs_steps_losses_and_membership_reach_its_history(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flextrain.cli.plot import draw
    from flextrain.master.history import read_events

    job_dir = tmp_path / "job"
    proc = subprocess.Popen(
        flextrain_cmd("run", "--job-dir", str(job_dir), "--no-progress", "--workers", "1", "--max-workers", "2",
                      SCRIPT, "--global-batch-size", str(G), "--max-micro-batch", "16", "--steps", "1000000",
                      "--step-seconds", "0.05"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def history(kind):
        path = job_dir / "events.jsonl"
        return [r for r in read_events(path) if r["type"] == kind] if path.exists() else []

    def round_of(size, after=-1):
        rounds = [r for r in history("round") if r["round"] > after and len(r["members"]) == size]
        return rounds[-1] if rounds else None

    try:
        wait_for(lambda: [r for r in history("metrics") if r["loss"] is not None], timeout=180,
                 what="a reported loss in the history")
        assert run_flextrain("scale", str(job_dir), "2").returncode == 0
        pair = wait_for(lambda: round_of(2), timeout=180, what="a round of 2")
        victim = next(m for m in read_status(job_dir)["members"] if m["id"] == pair["members"][1])
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: round_of(2, pair["round"]), timeout=180, what="a round of 2 after the kill")
        wait_for(lambda: [r for r in history("metrics") if r["time"] > round_of(2, pair["round"])["time"] + 1
                          and r["loss"] is not None], timeout=120, what="losses reported after the kill")
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    records = read_events(job_dir)
    metrics = [r for r in records if r["type"] == "metrics"]
    losses = [r["loss"] for r in metrics if r["loss"] is not None]
    assert len(losses) >= 3 and all(math.isfinite(x) for x in losses), err
    steps = [r["step"] for r in metrics]
    assert steps == sorted(steps) and steps[-1] > 0  # the scripts' own steps, never back after a restart
    assert max(r["recordsDone"] for r in metrics) >= G and any(r["samplesPerSecond"] > 0 for r in metrics)
    assert {r["workers"] for r in metrics} >= {1, 2}
    assert [(r["worker"], r["why"]) for r in records if r["type"] == "failure"] == [(victim["id"], "killed")]
    acc = EventAccumulator(str(job_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(losses)
    summary = draw(records)
    assert summary.points["loss"] == len(losses)
    assert summary.markers["failure"] == 1 and summary.markers["relaunch"] == 1 and summary.markers["scale"] == 1
