"""--evaluation-steps with --distribution-strategy ParameterServer: real master, PS and worker processes.

The stepcount model (tests/evaluation/zoo/stepcount.py) has one dense
parameter ``b`` that every optimizer update lowers by exactly 1 (SGD, lr 1,
the gradient of the mean of ``b``), so the metric ``step`` of an evaluation
is exactly the PS version of the model it evaluated.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ft_helpers import read_status, run_flextrain

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from evalcases import STEPCOUNT, write_csv

pytestmark = pytest.mark.e2e


STEPCOUNT_KERAS = f"{Path(__file__).resolve().parent / 'zoo' / 'stepcount_keras.py'}:custom_model"


def _job(tmp_path, *, workers: int, ps: int, extra=(), model=STEPCOUNT):
    write_csv(tmp_path / "validation" / "a.csv", range(60))  # x = 0..99: mean 49.5, accuracy 0.8
    write_csv(tmp_path / "validation" / "b.csv", range(60, 100))
    train = write_csv(tmp_path / "train" / "part.csv", range(640))
    job_dir = tmp_path / "job"
    # G=32: 20 optimizer updates in tasks of 8, 8 and 4 minibatches; every 5 -> 5 and 15 inside a task.
    proc = run_flextrain(
        "train", "--model-def", model, "--training-data", str(train.parent),
        "--validation-data", str(tmp_path / "validation"), "--distribution-strategy", "ParameterServer",
        "--ps", str(ps), "--workers", str(workers), "--global-batch-size", "32", "--max-micro-batch", "12",
        "--evaluation-steps", "5", "--job-dir", str(job_dir), *extra, timeout=180)
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded", status["message"]
    assert status["progress"]["recordsDone"] == 640
    return status, proc


def test_one_worker_evaluates_exactly_the_model_of_each_step(tmp_path):
    """One worker, two PS (``b`` lives on one of them): nothing else pushes, so step N's model is exactly N."""
    status, proc = _job(tmp_path, workers=1, ps=2)
    # The final evaluation (version 20) was the last periodic one: not repeated.
    assert [e["step"] for e in status["evaluations"]] == [5, 10, 15, 20]
    for e in status["evaluations"]:
        assert (e["samples"], e["metrics"]) == (100, {"step": float(e["step"]), "x": 49.5, "accuracy": 0.8})
    assert {k: status["metrics"][k] for k in ("step", "x", "accuracy")} == {"step": 20.0, "x": 49.5, "accuracy": 0.8}
    for step in (5, 10, 15, 20):
        assert f"evaluation at step {step}: accuracy 0.8000  step {step}.0000  x 49.5000" in proc.stderr


def test_two_workers_evaluate_a_model_at_least_as_new_as_the_step(tmp_path):
    """Two workers push concurrently (async PS): the evaluating worker's model is at version >= N, never older,
    the other worker trains on meanwhile, and training stays exactly-once (20 updates in all)."""
    status, _ = _job(tmp_path, workers=2, ps=2, extra=("--ps-mode", "async"))
    steps = [e["step"] for e in status["evaluations"]]
    assert steps == [5, 10, 15, 20]
    for e in status["evaluations"]:
        assert e["samples"] == 100 and e["metrics"]["x"] == 49.5 and e["metrics"]["accuracy"] == 0.8
        assert e["step"] <= e["metrics"]["step"] <= 20.0, e
        assert e["metrics"]["step"] == int(e["metrics"]["step"])  # one whole model version, not a mixture
    assert status["evaluations"][-1]["metrics"]["step"] == 20.0  # nothing is pushed after the last update


def test_keras_worker_evaluates_exactly_the_model_of_each_step(tmp_path):
    """The same with the Keras twin of the model (KerasPSTrainer, KerasPredictor)."""
    pytest.importorskip("tensorflow")
    status, _ = _job(tmp_path, workers=1, ps=1, model=STEPCOUNT_KERAS)
    assert [e["step"] for e in status["evaluations"]] == [5, 10, 15, 20]
    for e in status["evaluations"]:
        assert e["samples"] == 100
        assert e["metrics"] == pytest.approx({"step": float(e["step"]), "x": 49.5, "accuracy": 0.8})
