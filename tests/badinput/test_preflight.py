"""Preflight: `flextrain train` checks the module's contract on the first records, in a child
process, and refuses a broken module before any job directory or process exists.

Each case is model_zoo/digits_torch.py (or digits_keras.py) with one thing broken, run through the
real CLI in-process; the message must name the module file and the function, and for an exception
of the user's own, its type, text and the user's file:line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ft_helpers import MODEL_ZOO, REPO, read_status
from badinput_support import line_of, module
from flextrain.cli import main
from flextrain.worker.module import ModelDefError, load_model_def

def train(capsys, tmp_path, model_def: str, data: Path, *extra: str, validation: Path | None = None):
    args = ["train", "--model-def", model_def, "--training-data", str(data), "--job-dir", str(tmp_path / "job"),
            *(["--validation-data", str(validation)] if validation else []), *extra]
    code = main(args)
    return code, capsys.readouterr().err


def refused(code: int, err: str, tmp_path: Path, *expected: str) -> str:
    assert code == 2, err
    assert err.startswith("flextrain: error: "), err
    for text in expected:
        assert text in err, f"{text!r} not in {err!r}"
    assert not (tmp_path / "job").exists()  # nothing started
    return err


@pytest.fixture
def data(digits_data):
    return digits_data / "train"


# ---- the model and the optimizer ------------------------------------------------------------
def test_model_constructor_raises(capsys, tmp_path, data):
    path = module(tmp_path, "ctor", {"        super().__init__()\n":
                                     "        super().__init__()\n        raise FileNotFoundError('vocab.txt')\n"})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: the model callable Model() raised FileNotFoundError: vocab.txt",
            f"(at {path}:{line_of(path, 'vocab.txt')} in __init__)")


def test_model_callable_returning_something_else(capsys, tmp_path, data):
    path = module(tmp_path, "factory", {"def loss(": "def make():\n    return {'net': Model()}\n\n\ndef loss("})
    code, err = train(capsys, tmp_path, f"{path}:make", data)
    refused(code, err, tmp_path, f"{path}: the model callable make() returned dict, expected a torch.nn.Module")


def test_model_without_parameters(capsys, tmp_path, data):
    path = module(tmp_path, "empty", {"def loss(": "class Empty(nn.Module):\n    def forward(self, x):\n"
                                                   "        return x\n\n\ndef loss("})
    code, err = train(capsys, tmp_path, f"{path}:Empty", data)
    refused(code, err, tmp_path,
            f"{path}: the model callable Empty() returned a model (Empty) with no trainable parameters")


def test_optimizer_returning_none(capsys, tmp_path, data):
    path = module(tmp_path, "optnone", {"    return torch.optim.SGD(": "    torch.optim.SGD("})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: optimizer(params) returned None, expected a torch.optim.Optimizer")


def test_optimizer_raising_names_the_lr_it_was_given(capsys, tmp_path, data):
    path = module(tmp_path, "optraise", {"momentum=0.9": "momentum=-1"})
    code, err = train(capsys, tmp_path, f"{path}:Model", data, "--lr", "0.5")
    refused(code, err, tmp_path, f"{path}: optimizer(params, lr=0.5) raised ValueError: Invalid momentum value",
            f"(at {path}:{line_of(path, 'momentum=-1')} in optimizer)")


# ---- feed -------------------------------------------------------------------------------------
def test_feed_raising_shows_the_users_exception_and_line(capsys, tmp_path, data):
    path = module(tmp_path, "feedraise", {"    pixels, labels = decode_digits(records)\n":
                                          "    pixels, labels = decode_digits(records)\n"
                                          "    columns = {}\n    pixels = columns['image']\n"})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: feed(records, 'training', metadata) raised KeyError: 'image'",
            f"(at {path}:{line_of(path, 'columns[')} in feed)")


def test_a_data_error_raised_in_feed_names_the_module_the_file_and_the_records(capsys, tmp_path):
    (tmp_path / "two.csv").write_text("1,2\n3,4\n")  # CSV rows where the module decodes digits records
    path = MODEL_ZOO / "digits_torch.py"
    code, err = train(capsys, tmp_path, f"{path}:Model", tmp_path / "two.csv")
    refused(code, err, tmp_path, f"{path}: feed(records, 'training', metadata) raised DataError: digits record 0 "
                                 f"has 3 bytes, expected 65 (64 pixels + 1 label) on {tmp_path / 'two.csv'} "
                                 f"records [0, 2) (at {path}:{line_of(path, 'decode_digits(records)')} in feed)")


@pytest.mark.parametrize("old, new, expected", [
    ("return features, torch.from_numpy(labels)", "return [features, torch.from_numpy(labels)]",
     "feed(records, 'training', metadata) must return (features, labels), got list"),
    ("features = torch.from_numpy(pixels)", "features = torch.from_numpy(pixels)[:-1]",
     "feed returned features Tensor(63, 64); expected tensors whose first dimension is the number of records (64)"),
], ids=["list", "rows"])
def test_feed_returning_the_wrong_structure(capsys, tmp_path, data, old, new, expected):
    path = module(tmp_path, "feedshape", {old: new})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: {expected}")


# ---- forward, loss, backward -------------------------------------------------------------------
def test_forward_raising(capsys, tmp_path, data):
    path = module(tmp_path, "forward", {"return self.net(x)": "return self.net(x[:, :32])"})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: the model's forward (Model.forward) raised RuntimeError: mat1 and mat2",
            f"(at {path}:{line_of(path, 'x[:, :32]')} in forward)")


def test_loss_raising(capsys, tmp_path, data):
    path = module(tmp_path, "lossraise",
                  {"cross_entropy(predictions, labels)": "cross_entropy(predictions, labels + 10)"})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: loss(labels, predictions) raised IndexError: Target",
            f"(at {path}:{line_of(path, 'labels + 10')} in loss)")


def test_per_sample_loss(capsys, tmp_path, data):
    path = module(tmp_path, "persample", {"cross_entropy(predictions, labels)":
                                          "cross_entropy(predictions, labels, reduction='none')"})
    code, err = train(capsys, tmp_path, f"{path}:Model", data, "--global-batch-size", "32")
    refused(code, err, tmp_path, f"{path}: loss(labels, predictions) returned a tensor of shape (32,) for 32 "
                                 "samples; it must return the mean over the samples")


@pytest.mark.parametrize("new", ["nn.functional.cross_entropy(predictions, labels).detach()", "torch.tensor(2.3)"],
                         ids=["detached", "constant"])
def test_loss_without_gradient(capsys, tmp_path, data, new):
    path = module(tmp_path, "nograd", {"nn.functional.cross_entropy(predictions, labels)": new})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: loss(labels, predictions) returned a tensor that does not require grad")


def test_metric_returning_a_mean_instead_of_per_sample_values(capsys, tmp_path, digits_data):
    path = module(tmp_path, "metricmean", {"== labels).float()": "== labels).float().mean()"})
    code, err = train(capsys, tmp_path, f"{path}:Model", digits_data / "train",
                      validation=digits_data / "validation")
    refused(code, err, tmp_path, f"{path}: metric 'accuracy' returned 1 value for 64 samples")


# ---- the module itself ---------------------------------------------------------------------------
@pytest.mark.parametrize("old, new, expected", [
    ("def loss(labels, predictions):", "def loss(labels, predictions)", "SyntaxError"),
    ("from torch import nn\n", "from torch import nn\nimport torch_extension_not_installed\n",
     "ModuleNotFoundError"),
], ids=["syntax", "import"])
def test_module_that_does_not_import(capsys, tmp_path, data, old, new, expected):
    path = module(tmp_path, "broken", {old: new})
    code, err = train(capsys, tmp_path, f"{path}:Model", data)
    refused(code, err, tmp_path, f"{path}: importing the module failed", expected,
            f"(at {path}:{line_of(path, new.strip().splitlines()[-1])}")


def test_module_that_hangs_is_given_up_after_the_timeout(capsys, tmp_path, data):
    pid_file = tmp_path / "pid"
    path = module(tmp_path, "hangs", {"import torch\n": f"import os, time\nopen({str(pid_file)!r}, 'w')"
                                                       ".write(str(os.getpid()))\ntime.sleep(600)\nimport torch\n"})
    started = time.monotonic()
    code, err = train(capsys, tmp_path, f"{path}:Model", data, "--preflight-timeout", "5")
    assert time.monotonic() - started < 60
    refused(code, err, tmp_path, f"preflight of {path}:Model did not finish within 5s",
            "(it was importing the module", "--no-preflight skips it")
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the child was killed, not left behind
        os.kill(pid, 0)


@pytest.mark.parametrize("value", ["0", "-1", "inf"])
def test_preflight_timeout_must_be_positive_and_finite(capsys, tmp_path, data, value):
    code, err = train(capsys, tmp_path, f"{MODEL_ZOO / 'digits_torch.py'}:Model", data, "--preflight-timeout", value)
    refused(code, err, tmp_path, f"--preflight-timeout must be positive and finite, got {float(value)}")


# ---- Keras ------------------------------------------------------------------------------------------
def test_keras_loss_that_is_not_a_scalar(capsys, tmp_path):
    pytest.importorskip("tensorflow")
    from flextrain.data.example import write_digits_examples

    write_digits_examples(tmp_path / "examples")
    source = (MODEL_ZOO / "digits_keras.py").read_text()
    per_sample = {"    return tf.reduce_mean(\n        input_tensor=": "    return (\n        "}
    path = module(tmp_path, "kerasloss", per_sample, source=source)
    code, err = train(capsys, tmp_path, f"{path}:custom_model", tmp_path / "examples" / "train",
                      "--global-batch-size", "16")
    refused(code, err, tmp_path, f"{path}: loss(labels, predictions) returned a tensor of shape (16,) for 16 samples")


# ---- --no-preflight ------------------------------------------------------------------------------
def test_no_preflight_lets_the_job_start(tmp_path, data):
    """A failure only preflight catches: without it the job starts and its worker meets it."""
    path = module(tmp_path, "optnone", {"    return torch.optim.SGD(": "    torch.optim.SGD("})
    job_dir = tmp_path / "job"
    proc = subprocess.run(
        [sys.executable, "-m", "flextrain", "train", "--model-def", f"{path}:Model", "--training-data", str(data),
         "--job-dir", str(job_dir), "--no-preflight", "--relaunch-budget", "0", "--min-workers-timeout", "20",
         "--no-progress"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode not in (0, 2), proc.stderr  # it started, then failed in the worker
    status = read_status(job_dir)
    assert status["phase"] == "Failed"
    assert "optimizer(params) returned None" in status["message"]  # the worker met the same check


def test_no_preflight_travels_to_kubernetes_as_training_preflight_false(capsys, tmp_path):
    import yaml

    from flextrain.k8s.resource import jobspec_from_resource

    assert main(["train", "--backend", "kubernetes", "--dry-run", "--model-def", "/zoo/m.py:Model",
                 "--training-data", "/data", "--job-dir", "/jobs/m", "--no-preflight"]) == 0
    body = yaml.safe_load(capsys.readouterr().out)
    assert body["spec"]["training"]["preflight"] is False
    assert jobspec_from_resource(body).training.preflight is False
    del body["spec"]["training"]["preflight"]
    assert jobspec_from_resource(body).training.preflight is True  # the default, as on the command line


# ---- the checks every worker makes too (ModelDef.build_model / build_optimizer) -------------------------
def load(tmp_path, name: str, replace: dict[str, str], model: str = "Model"):
    return load_model_def(f"{module(tmp_path, name, replace)}:{model}")


def test_build_model_names_what_the_callable_returned(tmp_path):
    md = load(tmp_path, "unit_none", {"def loss(": "def nothing():\n    return None\n\n\ndef loss("}, "nothing")
    with pytest.raises(ModelDefError, match=r"unit_none.py: the model callable nothing\(\) returned None, "
                                            r"expected a torch.nn.Module"):
        md.build_model()


def test_build_model_refuses_a_model_with_only_frozen_parameters(tmp_path):
    md = load(tmp_path, "unit_frozen", {"    def forward(self, x):": "        self.requires_grad_(False)\n\n"
                                                                    "    def forward(self, x):"})
    with pytest.raises(ModelDefError, match=r"unit_frozen.py: the model callable Model\(\) returned a model "
                                            r"\(Model\) with no trainable parameters"):
        md.build_model()


def test_build_model_wraps_the_users_exception(tmp_path):
    md = load(tmp_path, "unit_ctor", {"        super().__init__()\n": "        super().__init__()\n        1 / 0\n"})
    with pytest.raises(ModelDefError, match=r"unit_ctor.py: the model callable Model\(\) raised "
                                            r"ZeroDivisionError: division by zero") as info:
        md.build_model()
    assert isinstance(info.value.__cause__, ZeroDivisionError)  # the worker's failure report finds the user frame


@pytest.mark.parametrize("body, expected", [
    ("    torch.optim.SGD(params, lr=lr)", r"optimizer\(params, lr=0.5\) returned None"),
    ("    return list(params)", r"optimizer\(params, lr=0.5\) returned list, expected a torch.optim.Optimizer"),
    ("    raise RuntimeError('no optimizer for you')",
     r"optimizer\(params, lr=0.5\) raised RuntimeError: no optimizer"),
], ids=["none", "list", "raises"])
def test_build_optimizer_checks_what_optimizer_returned(tmp_path, body, expected):
    md = load(tmp_path, "unit_opt", {"    return torch.optim.SGD(params, lr=lr, momentum=0.9)": body})
    with pytest.raises(ModelDefError, match=rf"unit_opt.py: {expected}"):
        md.build_optimizer(md.build_model(), 0.5)


def test_keras_optimizer_returning_none(tmp_path):
    pytest.importorskip("tensorflow")
    source = (MODEL_ZOO / "digits_keras.py").read_text()
    path = module(tmp_path, "unit_kopt", {"    return tf.keras.optimizers.SGD(": "    tf.keras.optimizers.SGD("},
                  source=source)
    md = load_model_def(f"{path}:custom_model")
    with pytest.raises(ModelDefError, match=r"unit_kopt.py: optimizer\(lr=0.1\) returned None, expected a tf.keras"):
        md.build_optimizer(md.build_model(), 0.1)
