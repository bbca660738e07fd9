"""A job on a batch-size trace with the linear LR rule (docs/batch-schedules.md): through a killed
worker, a scale-up, a stop and ``--resume``, every record is trained exactly once per epoch, each step
runs with the trace's G, the workers' LR follows G, and status.json shows the G of the step in progress."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from flextrain.data import DataOptions, make_shards
from flextrain.elastic.noise import GradientNoise
from flextrain.elastic.schedule import BatchSchedule
from flextrain.elastic.statecodec import decode
from flextrain.master.ledger import TaskLedger
from ft_helpers import (COUNTING_MODEL, counting_data, finish, flextrain_cmd, read_status, run_flextrain, seen_counts,
                        wait_for, without_feed_delay)

pytestmark = pytest.mark.e2e

SIZES = [16] * 20 + [32] * 30 + [64] * 30 + [24] * 60 + [48]  # 48 from step 140 on (a slow stop under load
# reached step 102: the stop must still land mid-trace)
LR, REF = 0.05, 32
LR_LINE = re.compile(r"from step (\d+): global batch (\d+), learning rate ([\d.e-]+),")


def trace_file(path):
    path.write_text("step,batchsize\n" + "".join(f"{i},{g}\n" for i, g in enumerate(SIZES)))
    return path


def train(*args, env):
    return subprocess.Popen(flextrain_cmd("train", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def resume(job_dir, env):
    """``flextrain train --resume`` of a stopped job, without FT_FEED_DELAY: that stand-in compute only
    kept the first run from ending before the test's events; the resumed run trains at full speed."""
    return train("--resume", str(job_dir), "--no-progress", env=without_feed_delay(env))


def test_a_trace_with_the_linear_rule_through_kill_scale_stop_and_resume(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir, trace = tmp_path / "job", trace_file(tmp_path / "trace.csv")
    env = {**os.environ, "FT_COUNT_G": "any", "FT_FEED_DELAY": "0.1", "FLEXTRAIN_LOG_LEVEL": "INFO"}
    proc = train("--model-def", COUNTING_MODEL, "--training-data", str(data), "--batch-schedule", str(trace),
                 "--lr-rule", "linear", "--reference-batch-size", str(REF), "--lr", str(LR),
                 "--max-micro-batch", "16", "--epochs", "4", "--workers", "2", "--min-workers", "1",
                 "--max-workers", "3", "--checkpoint-steps", "5", "--steps-per-task", "4", "--no-progress",
                 "--job-dir", str(job_dir), env=env)
    schedule = BatchSchedule.of_sizes(SIZES)
    try:
        def running(s=None):
            s = s or (read_status(job_dir) if (job_dir / "status.json").exists() else None)
            return s if s and s["phase"] == "Running" and s["roundHistory"] else None

        first = wait_for(lambda: (s := running()) and s["step"] >= 8 and len(s["members"]) == 2 and s,
                         timeout=180, what="two workers training")
        assert first["globalBatchSize"] == schedule.global_batch(first["step"])
        assert first["lrFactor"] == schedule.global_batch(first["step"]) / REF
        os.kill(first["members"][1]["pid"], signal.SIGKILL)
        after_kill = wait_for(lambda: (s := running()) and s["rounds"] > first["rounds"] and s["step"] > 20 and s,
                              timeout=180, what="training on after the kill")
        assert run_flextrain("scale", str(job_dir), "3").returncode == 0
        wait_for(lambda: (s := running()) and len(s["members"]) == 3 and s["step"] > after_kill["step"] + 3,
                 timeout=180, what="three workers training")
        s = wait_for(lambda: (s := running()) and s["step"] >= 55 and s, timeout=180, what="step 55")
        assert s["globalBatchSize"] == schedule.global_batch(s["step"])
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1 and "resume with" in read_status(job_dir)["message"], err
    stopped = read_status(job_dir)["step"]
    assert stopped < 140, "the job must stop mid-trace, before its end"

    code, err = finish(resume(job_dir, env))
    assert code == 0, err
    final = read_status(job_dir)
    seen, version = seen_counts(job_dir)
    assert set(seen.tolist()) == {4.0}, "every record trained exactly once per epoch"
    # The steps an undisturbed run takes. An interruption may add a few (the re-queued remainder of a
    # killed worker's task ends in a short step of its own), never drop one: records count exactly once.
    ledger = TaskLedger(shards=make_shards(str(data), what="training data", options=DataOptions()), epochs=4,
                        global_batch_size=64, steps_per_task=4, schedule=schedule)
    steps = 0
    while (task := ledger.next_training_task("x")) is not None:
        steps += task.steps
        ledger.complete(task.task_id)
    assert version == final["step"] and steps <= version <= steps + 4, (version, steps)
    assert final["globalBatchSize"] == 48 and final["lrFactor"] == 48 / REF

    # Every worker's LR followed the trace: each change logged at the step it took effect, both runs.
    changes = [(int(m[1]), int(m[2]), float(m[3])) for log in (job_dir / "logs").rglob("*.log")
               for m in LR_LINE.finditer(log.read_text())]
    assert changes and all(g == schedule.global_batch(step) and abs(lr - LR * g / REF) < 1e-9
                           for step, g, lr in changes), changes
    assert {16, 32, 64, 48} <= {g for _, g, _ in changes}
    assert any(step >= stopped - 5 and g == schedule.global_batch(stopped) for step, g, _ in changes), \
        "the resumed workers start mid-trace at the checkpoint's step"


ADA_SIZES = [64] * 80 + [32]  # G == ref from step 80 on (the last 16 steps)
ADA_LINE = re.compile(r"from step (\d+): global batch (\d+), adascale rule: gain so far ([\d.e+-]+),")


def test_adascale_measures_its_gain_through_scale_stop_and_resume(digits_data, tmp_path):
    """--lr-rule adascale: the LR factor status.json shows is the measured gain (1 < gain <= G/ref while
    G > ref), with the gradient noise scale; the estimates reach a newcomer and a resumed job; at G == ref
    the gain, and so the LR, is exactly the base; every record is trained exactly once per epoch."""
    data = counting_data(digits_data, tmp_path / "data")
    job_dir, trace = tmp_path / "job", tmp_path / "trace.csv"
    trace.write_text("step,batchsize\n" + "".join(f"{i},{g}\n" for i, g in enumerate(ADA_SIZES)))
    env = {**os.environ, "FT_COUNT_G": "any", "FT_FEED_DELAY": "0.2", "FLEXTRAIN_LOG_LEVEL": "INFO"}
    proc = train("--model-def", COUNTING_MODEL, "--training-data", str(data), "--batch-schedule", str(trace),
                 "--lr-rule", "adascale", "--reference-batch-size", str(REF), "--lr", str(LR),
                 "--max-micro-batch", "16", "--epochs", "4", "--workers", "2", "--min-workers", "1",
                 "--max-workers", "3", "--checkpoint-steps", "5", "--steps-per-task", "4", "--no-progress",
                 "--job-dir", str(job_dir), env=env)
    try:
        def running():
            s = read_status(job_dir) if (job_dir / "status.json").exists() else None
            return s if s and s["phase"] == "Running" and s["roundHistory"] else None

        s = wait_for(lambda: (s := running()) and s["lrFactor"] > 1 and "gradientNoiseScale" in s and s,
                     timeout=180, what="a measured gain")
        assert s["lrRule"] == "adascale" and 1 < s["lrFactor"] <= 64 / REF
        assert s["learningRate"] == pytest.approx(LR * s["lrFactor"], rel=1e-5)
        assert isinstance(s["gradientNoiseScale"], str) or s["gradientNoiseScale"] >= 0
        assert run_flextrain("scale", str(job_dir), "3").returncode == 0
        wait_for(lambda: (s := running()) and len(s["members"]) == 3 and s,
                 timeout=180, what="three workers training")
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1 and "resume with" in read_status(job_dir)["message"], err
    stopped = read_status(job_dir)["step"]
    assert stopped < 80, "the job must stop while G > ref, so the resumed workers load a gain above 1"

    code, err = finish(resume(job_dir, env))
    assert code == 0, err
    final = read_status(job_dir)
    seen, version = seen_counts(job_dir)
    assert set(seen.tolist()) == {4.0}, "every record trained exactly once per epoch"
    undisturbed = 80 + (4 * 1408 - 80 * 64) // 32
    assert version == final["step"] and undisturbed <= version <= undisturbed + 4, (version, undisturbed)  # (above)
    # The last steps ran at G == ref: gain 1 exactly, the base LR itself, in status and in the model.
    assert final["globalBatchSize"] == REF and final["lrFactor"] == 1.0 and final["learningRate"] == LR
    state = decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())
    assert state["optimizer"]["param_groups"][0]["lr"] == LR and state["adascale"]["gain"] == 1.0
    noise = GradientNoise()
    noise.load_state_dict(state["adascale"])
    assert 1 < noise.gain(64, REF) <= 2, "what the estimates give a step of 64 against 32"

    # Each worker logs its gain so far when a task's G differs from its last: a worker that starts at
    # step 0 has measured nothing (1); one that starts later in the G=64 phase (the newcomer, the
    # resumed ones) got the estimates with the model and has a gain above 1.
    lines = [(int(m[1]), int(m[2]), float(m[3])) for log in (job_dir / "logs").rglob("*.log")
             for m in ADA_LINE.finditer(log.read_text())]
    assert all(gain == 1.0 for step, _, gain in lines if step == 0), lines
    late = [(step, gain) for step, g, gain in lines if 0 < step < 80 and g == 64]
    assert all(gain > 1.0 for _, gain in late), lines
    assert any(step < stopped for step, _ in late), f"the newcomer's line: {lines}"
    assert sum(step == stopped for step, _ in late) >= 2, f"the resumed workers' lines: {lines}"
