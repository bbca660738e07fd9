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
from flextrain.elastic.schedule import BatchSchedule
from flextrain.master.ledger import TaskLedger
from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, run_flextrain, seen_counts, wait_for

pytestmark = pytest.mark.e2e

SIZES = [16] * 20 + [32] * 30 + [64] * 30 + [24] * 20 + [48]  # 48 from step 100 on
LR, REF = 0.05, 32
LR_LINE = re.compile(r"from step (\d+): global batch (\d+), learning rate ([\d.e-]+),")


def trace_file(path):
    path.write_text("step,batchsize\n" + "".join(f"{i},{g}\n" for i, g in enumerate(SIZES)))
    return path


def train(*args, env):
    return subprocess.Popen(flextrain_cmd("train", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def finish(proc, timeout=300):
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, err


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
    assert stopped < 100, "the job must stop mid-trace, before its end"

    resumed = train("--resume", str(job_dir), "--no-progress", env=env)
    code, err = finish(resumed)
    assert code == 0, err
    final = read_status(job_dir)
    seen, version = seen_counts(job_dir)
    assert set(seen.tolist()) == {4.0}, "every record trained exactly once per epoch"
    # The steps an undisturbed run takes: kills, scaling and the resume changed none of them.
    ledger = TaskLedger(shards=make_shards(str(data), what="training data", options=DataOptions()), epochs=4,
                        global_batch_size=64, steps_per_task=4, schedule=schedule)
    steps = 0
    while (task := ledger.next_training_task("x")) is not None:
        steps += task.steps
        ledger.complete(task.task_id)
    assert version == final["step"] == steps
    assert final["globalBatchSize"] == 48 and final["lrFactor"] == 48 / REF

    # Every worker's LR followed the trace: each change logged at the step it took effect, both runs.
    changes = [(int(m[1]), int(m[2]), float(m[3])) for log in (job_dir / "logs").rglob("*.log")
               for m in LR_LINE.finditer(log.read_text())]
    assert changes and all(g == schedule.global_batch(step) and abs(lr - LR * g / REF) < 1e-9
                           for step, g, lr in changes), changes
    assert {16, 32, 64, 48} <= {g for _, g, _ in changes}
    assert any(step >= stopped - 5 and g == schedule.global_batch(stopped) for step, g, _ in changes), \
        "the resumed workers start mid-trace at the checkpoint's step"
