"""A job's recorded history (events.jsonl), its TensorBoard files and `flextrain plot`, from one real
local job with a scale-up and a SIGKILLed worker, stopped and resumed by a second master."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, run_flextrain, wait_for

pytestmark = pytest.mark.e2e

G = 32


def _by_type(records, kind):
    return [r for r in records if r["type"] == kind]


@pytest.fixture(scope="module")
def scaled_and_killed(digits_data, tmp_path_factory):
    """(job dir, the killed worker's id, bytes of events.jsonl the first master left): a job scaled 2 -> 3,
    one of its workers SIGKILLed and relaunched, stopped, then resumed by a new master and stopped again."""
    tmp = tmp_path_factory.mktemp("history")
    data = counting_data(digits_data, tmp / "data")
    job_dir = tmp / "job"
    train = ("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size", str(G),
             "--max-micro-batch", "8", "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "2",
             "--min-workers", "1", "--max-workers", "3", "--epochs", "1000")
    env = {**os.environ, "FT_COUNT_G": str(G)}

    def status():
        s = read_status(job_dir) if (job_dir / "status.json").exists() else None
        return s if s and s["phase"] == "Running" else None

    def trained_in(size, after=-1):
        s = status()
        rnd = s["roundHistory"][-1] if s and s["roundHistory"] else None
        return s if (rnd and rnd["round"] > after and len(rnd["members"]) == size and s["step"] > rnd["version"] + 3
                     and s["workers"]["active"] == size) else None

    def recorded_with(size):
        """A `metrics` record written while `size` workers trained: one comes every METRICS_INTERVAL, which
        a short window of a loaded machine may not span."""
        from flextrain.master.history import read_events

        return any(r["type"] == "metrics" and r["workers"] == size for r in read_events(job_dir))

    proc = subprocess.Popen(flextrain_cmd(*train), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        s = wait_for(lambda: trained_in(2), timeout=180, what="2 workers training")
        wait_for(lambda: recorded_with(2), timeout=60, what="a metrics record of 2 workers")
        assert run_flextrain("scale", str(job_dir), "3").returncode == 0
        s = wait_for(lambda: trained_in(3, s["roundHistory"][-1]["round"]), timeout=180, what="3 workers training")
        wait_for(lambda: recorded_with(3), timeout=60, what="a metrics record of 3 workers")
        victim = s["members"][1]
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: (x := trained_in(3, s["roundHistory"][-1]["round"])) and victim["id"] not in
                 {m["id"] for m in x["members"]}, timeout=180, what="the killed worker replaced")
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    first = (job_dir / "events.jsonl").read_bytes()
    step = read_status(job_dir)["step"]
    proc = subprocess.Popen(flextrain_cmd("train", "--resume", str(job_dir), "--no-progress"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(lambda: (x := status()) and x["step"] > step + 3, timeout=180, what="the resumed job training")
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    return job_dir, victim["id"], first


def test_the_history_records_the_scale_up_the_kill_and_its_relaunch(scaled_and_killed):
    from flextrain.master.history import read_events

    job_dir, victim, _ = scaled_and_killed
    records = read_events(job_dir)
    lines = (job_dir / "events.jsonl").read_text().splitlines()
    assert len(records) == len(lines)  # every line is one record
    assert [r["desired"] for r in _by_type(records, "scale")] == [3]
    scale, launch = _by_type(records, "scale")[0], _by_type(records, "launch")[0]  # the scale-up's worker
    assert records.index(scale) < records.index(launch) and scale["time"] <= launch["time"]  # asked, then launched
    failure, = _by_type(records, "failure")
    assert failure["worker"] == victim and failure["why"] == "killed" and "SIGKILL" in failure["detail"]
    relaunch, = _by_type(records, "relaunch")
    assert relaunch["replaces"] == victim
    leaves = _by_type(records, "leave")
    assert [(r["worker"], r["why"]) for r in leaves] == [(victim, "killed")]
    joined = [r["worker"] for r in _by_type(records, "join") if r["why"] == "joined"]
    assert relaunch["worker"] in joined and len(joined) >= 2  # the scale-up's worker and the replacement
    rounds = _by_type(records, "round")
    assert len({len(r["members"]) for r in rounds}) >= 2 and all(r["members"] for r in rounds)
    metrics = _by_type(records, "metrics")
    # A record of a trained step waits for its loss (also a resumed master's first ones, at the checkpoint's step).
    assert len(metrics) >= 3 and all(r["loss"] is not None for r in metrics if r["step"] > 0), metrics
    assert {r["workers"] for r in metrics} >= {2, 3} and {r["globalBatch"] for r in metrics} == {G}
    steps = [r["step"] for r in metrics]
    assert steps[-1] > steps[0]
    assert [r["phase"] for r in _by_type(records, "phase")][-1] == "Failed"  # stopped


def test_a_resumed_master_appends_and_never_rewrites(scaled_and_killed):
    from flextrain.master.history import read_events

    job_dir, _, first = scaled_and_killed
    now = (job_dir / "events.jsonl").read_bytes()
    assert now.startswith(first) and len(now) > len(first)
    starts = _by_type(read_events(job_dir), "start")
    assert [s["resume"] for s in starts] == [False, True]
    later = [json.loads(line) for line in now[len(first):].decode().splitlines()]
    assert later[0]["type"] == "start" and _by_type(later, "metrics")  # the new master's own records only
    assert not _by_type(later, "failure")  # the first run's failure is not recorded again
    # the job's end is its last record: after its last round, joins and metrics, none of them later
    assert later[-1]["type"] == "phase" and later[-1]["phase"] in ("Succeeded", "Failed"), later[-3:]
    assert later[-1]["time"] >= max(r["time"] for r in later)


def test_tensorboard_files_hold_the_same_history(scaled_and_killed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from flextrain.master.history import read_events

    job_dir, victim, _ = scaled_and_killed
    acc = EventAccumulator(str(job_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    records = read_events(job_dir)
    metrics = [r for r in _by_type(records, "metrics") if r["loss"] is not None]
    loss = acc.Scalars("train/loss")
    assert [(e.step, round(e.value, 4)) for e in loss] == [(r["step"], round(r["loss"], 4)) for r in metrics]
    assert {e.value for e in acc.Scalars("train/workers")} >= {2.0, 3.0}
    assert {e.value for e in acc.Scalars("train/global_batch")} == {float(G)}
    assert acc.Scalars("train/samples_per_second") and acc.Scalars("train/lr_factor")
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("membership/text_summary")]
    assert any(victim in t and "killed" in t for t in texts)
    assert any("desired workers 2 -> 3" in t for t in texts)


def test_the_plot_marks_the_kill_the_joins_and_the_relaunch(scaled_and_killed, tmp_path):
    from flextrain.cli.plot import draw
    from flextrain.master.history import read_events

    job_dir, _, _ = scaled_and_killed
    records = read_events(job_dir)
    summary = draw(records)
    assert summary.markers["failure"] == 1 and summary.markers["relaunch"] == 1
    assert summary.markers["scale"] == 1 and summary.markers["start"] == 1  # the resumed master
    assert "scale 2→3" in summary.labels and summary.labels.count("stopped") == 2  # each run was stopped
    assert summary.markers["join"] == len([r for r in _by_type(records, "join") if r["why"] != "start"])
    assert summary.points["loss"] == len([r for r in _by_type(records, "metrics") if r["loss"] is not None])
    assert summary.points["workers"] == len(_by_type(records, "metrics"))
    out = tmp_path / "job.png"
    proc = run_flextrain("plot", str(job_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert "1 failure" in proc.stdout and "1 relaunch" in proc.stdout
