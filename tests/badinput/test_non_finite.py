"""NaN and infinity: never a success, never a silent metric, never a prediction.

The module is model_zoo/digits_torch.py whose ``feed`` turns the pixels of some records into NaN
in the workers, so the loss and the gradient of those steps are NaN.
"""

from __future__ import annotations

import json

import pytest
import torch

from ft_helpers import MODEL_ZOO, read_status, run_flextrain
from flextrain.elastic.statecodec import decode, encode, nonfinite
from flextrain.failures import ExitCode

pytestmark = pytest.mark.e2e

DIGITS = (MODEL_ZOO / "digits_torch.py").read_text()


def nan_module(tmp_path, first: int, last: int):
    """Records [first, last) of each file reach the model as NaN pixels."""
    source = DIGITS.replace("    features = torch.from_numpy(pixels)\n", (
        "    features = torch.from_numpy(pixels)\n"
        f"    ids = torch.arange(metadata.start, metadata.end)\n"
        f"    features[(ids >= {first}) & (ids < {last})] = float('nan')\n"))
    path = tmp_path / "nanfeed.py"
    path.write_text(source)
    return path


def train(tmp_path, module, data, *extra):
    job_dir = tmp_path / "job"
    proc = run_flextrain("train", "--model-def", f"{module}:Model", "--training-data", str(data),
                         "--job-dir", str(job_dir), "--workers", "2", "--global-batch-size", "64",
                         "--no-progress", "--no-preflight", *extra, timeout=200)
    return proc, read_status(job_dir), job_dir


def test_a_nan_loss_fails_the_job_naming_the_step_and_the_last_good_checkpoint(tmp_path, digits_data):
    proc, status, job_dir = train(tmp_path, nan_module(tmp_path, 640, 10**9), digits_data / "train",
                                  "--checkpoint-steps", "4")
    assert proc.returncode == ExitCode.NON_FINITE, proc.stderr
    assert status["phase"] == "Failed" and status["failure"]["kind"] == "NonFinite"
    assert "loss of step 11 is not finite" in status["message"]  # records [640, 704) are step 11
    assert "last good checkpoint: " in status["message"] and "ckpt-000000008.ckpt (step 8)" in status["message"]
    # what that checkpoint keeps, not 0: the round's tasks were never settled, its records are the checkpoint's
    assert status["progress"]["recordsDone"] == 8 * 64, status["progress"]
    assert not (job_dir / "checkpoints" / "final.ckpt").exists()
    for ckpt in (job_dir / "checkpoints").glob("*.ckpt"):  # nothing non-finite was ever written
        assert nonfinite(decode(ckpt.read_bytes())["model"]) == []


def test_skip_step_drops_the_bad_step_and_succeeds_with_a_finite_model(tmp_path, digits_data):
    proc, status, job_dir = train(tmp_path, nan_module(tmp_path, 640, 704), digits_data / "train",
                                  "--nan-policy", "skip-step")
    assert proc.returncode == 0, proc.stderr
    assert status["phase"] == "Succeeded" and status["skippedSteps"] == 1
    assert any("skipped 1 step(s)" in e for e in status["events"])
    assert nonfinite(decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())["model"]) == []
    assert isinstance(status["metrics"]["loss"], float)


def test_a_metric_that_is_not_finite_is_shown_not_dropped(tmp_path, digits_data):
    module = tmp_path / "nanmetric.py"
    module.write_text(DIGITS.replace(
        '    return {"accuracy": lambda labels, predictions: (predictions.argmax(dim=1) == labels).float()}',
        '    return {"accuracy": lambda labels, predictions: (predictions.argmax(dim=1) == labels).float(),\n'
        '            "broken": lambda labels, predictions: torch.full(labels.shape, float("nan"))}'))
    proc, status, _ = train(tmp_path, module, digits_data / "train", "--validation-data",
                            str(digits_data / "validation"))
    assert proc.returncode == 0, proc.stderr
    assert status["metrics"]["broken"] == "nan" and isinstance(status["metrics"]["accuracy"], float)
    assert "broken: nan" in proc.stderr


def test_prediction_refuses_a_checkpoint_with_non_finite_weights(tmp_path, digits_data, capsys):
    from flextrain.cli import main

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    state = {f"net.{k}": v for k, v in model.state_dict().items()}
    state["net.2.bias"][3] = float("inf")
    ckpt = tmp_path / "bad.ckpt"
    ckpt.write_bytes(encode({"model": state, "optimizer": {}, "version": 7}))
    code = main(["predict", "--model-def", f"{MODEL_ZOO / 'digits_torch.py'}:Model", "--checkpoint", str(ckpt),
                 "--prediction-data", str(digits_data / "validation"), "--output", str(tmp_path / "out"),
                 "--job-dir", str(tmp_path / "job")])
    assert code == 2
    err = capsys.readouterr().err
    assert "non-finite weights (net.2.bias (1 inf of 10))" in err and str(ckpt) in err
    assert not (tmp_path / "out" / "manifest.json").exists() and not (tmp_path / "job").exists()


def test_non_finite_values_round_trip_through_status_json_as_text(tmp_path):
    from flextrain.master.status import shown

    values = {"a": shown(float("nan")), "b": shown(float("inf")), "c": shown(-float("inf")), "d": shown(0.5)}
    assert json.loads(json.dumps(values)) == {"a": "nan", "b": "inf", "c": "-inf", "d": 0.5}
