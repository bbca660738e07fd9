"""LR rules for Keras modules in jobs (docs/batch-schedules.md): the workers set the Keras optimizer's
learning rate to base × the rule's factor as the trace's global batch changes; adascale measures its
gain from the Keras gradients; a learning-rate schedule, which no rule can scale, is refused at
submission naming it."""

from __future__ import annotations

import re

import pytest

from ft_helpers import MODEL_ZOO, read_status, run_flextrain

pytestmark = pytest.mark.e2e

DIGITS = f"{MODEL_ZOO / 'digits_keras.py'}:custom_model"
LR, REF = 0.05, 32
LR_LINE = re.compile(r"from step (\d+): global batch (\d+), learning rate ([\d.e-]+)")
GAIN_LINE = re.compile(r"from step (\d+): global batch (\d+), adascale rule: gain so far ([\d.e+-]+),")


def trace(path, sizes):
    path.write_text("step,batchsize\n" + "".join(f"{i},{g}\n" for i, g in enumerate(sizes)))
    return str(path)


def logged(job_dir, pattern):
    return [(int(m[1]), int(m[2]), float(m[3])) for log in (job_dir / "logs").rglob("*.log")
            for m in pattern.finditer(log.read_text())]


def train(digits_examples, job_dir, *args):
    return run_flextrain("train", "--model-def", DIGITS, "--training-data", str(digits_examples / "train"),
                         "--epochs", "1", "--max-micro-batch", "16", "--lr", str(LR), "--reference-batch-size",
                         str(REF), "--job-dir", str(job_dir), "--no-progress", *args,
                         env_extra={"FLEXTRAIN_LOG_LEVEL": "INFO"}, timeout=400)


def test_a_keras_job_follows_the_trace_with_the_linear_rule(digits_examples, tmp_path):
    job_dir = tmp_path / "job"
    proc = train(digits_examples, job_dir, "--workers", "2", "--lr-rule", "linear",
                 "--batch-schedule", trace(tmp_path / "trace.csv", [32] * 10 + [64] * 10 + [48]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = read_status(job_dir)
    assert final["phase"] == "Succeeded" and final["globalBatchSize"] == 48
    assert final["lrFactor"] == 48 / REF and final["learningRate"] == pytest.approx(LR * 48 / REF)
    changes = logged(job_dir, LR_LINE)
    assert {g for _, g, _ in changes} == {32, 64, 48}, changes
    # each worker's Keras optimizer took base × G/ref at the step the trace changed G (float32 LR)
    for step, g, lr in changes:
        assert g == ([32] * 10 + [64] * 10 + [48])[min(step, 20)] and lr == pytest.approx(LR * g / REF, rel=1e-6)


def test_a_keras_job_measures_its_adascale_gain(digits_examples, tmp_path):
    job_dir = tmp_path / "job"
    sizes = [64] * 15 + [32]  # 4 micro-batches of 16 per step, then G == ref (1438 records: 30 steps)
    proc = train(digits_examples, job_dir, "--workers", "1", "--lr-rule", "adascale",
                 "--batch-schedule", trace(tmp_path / "trace.csv", sizes))
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = read_status(job_dir)
    assert final["lrRule"] == "adascale" and final["globalBatchSize"] == REF
    # The epoch's last step has 1438 - 960 - 14 * 32 = 30 samples, fewer than ref: a gain just below 1.
    assert 0.5 < final["lrFactor"] < 1.0 and final["learningRate"] == pytest.approx(LR * final["lrFactor"])
    assert final["gradientNoiseScale"] > 0
    gains = logged(job_dir, GAIN_LINE)
    assert (0, 64, 1.0) in gains, gains  # nothing measured before the first step
    (later,) = [gain for step, g, gain in gains if g == REF]
    assert 1.0 < later <= 64 / REF, gains  # measured over the G=64 steps: noisy gradients, a gain above 1


def test_a_learning_rate_schedule_with_an_lr_rule_is_refused_at_submission(digits_examples, tmp_path):
    module = tmp_path / "scheduled.py"
    module.write_text((MODEL_ZOO / "digits_keras.py").read_text().replace(
        "tf.keras.optimizers.SGD(learning_rate=lr, momentum=0.9)",
        "tf.keras.optimizers.SGD(learning_rate=tf.keras.optimizers.schedules.ExponentialDecay(lr, 10, 0.9))"))
    proc = run_flextrain("train", "--model-def", f"{module}:custom_model", "--training-data",
                         str(digits_examples / "train"), "--lr-rule", "sqrt", "--job-dir", str(tmp_path / "job"),
                         timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert ("--lr-rule scales the optimizer's learning rate, but optimizer(...) returned a SGD whose "
            "learning_rate is a schedule (ExponentialDecay)") in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "job" / "status.json").exists()
