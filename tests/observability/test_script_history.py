"""A script job (`flextrain run`) reports its steps and losses into the job's history: the GA optimizer of
examples/elastic_script_torch.py reports through flextrain.elastic.progress, the agents' heartbeats carry
it, and events.jsonl, the TensorBoard files and `flextrain plot` show it, with a scale-up and a kill (the
session's script job of tests/script_jobs_support.py, which tests/scriptjobs also reads)."""

from __future__ import annotations

import math

import pytest

from script_jobs_support import G, reported_losses

pytestmark = pytest.mark.e2e


def test_a_script_jobs_steps_losses_and_membership_reach_its_history(script_scaled_and_killed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flextrain.cli.plot import draw
    from flextrain.master.history import read_events

    job = script_scaled_and_killed  # 1 worker, scaled to 2, one of the pair killed
    job_dir, victim, err = job.job_dir, job.victim, job.err
    assert reported_losses(job_dir, after=job.again["time"] + 1), "losses reported after the kill"
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
