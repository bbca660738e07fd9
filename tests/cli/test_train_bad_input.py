"""`flextrain train` rejects bad input before any process starts, naming the problem."""

from __future__ import annotations

import shutil

import pytest

from ft_helpers import DIGITS_MODEL, REPO
from flextrain.cli import main


def train(capsys, *extra, data=None, model=DIGITS_MODEL, tmp=None):
    args = ["train", "--model-def", model, "--training-data", str(data), "--job-dir", str(tmp / "job"), *extra]
    code = main(args)
    return code, capsys.readouterr().err


@pytest.fixture
def data(digits_data):
    return digits_data / "train"


def test_missing_data_directory(capsys, tmp_path):
    code, err = train(capsys, data=tmp_path / "nope", tmp=tmp_path)
    assert code == 2
    assert "training data directory not found" in err and str(tmp_path / "nope") in err
    assert not (tmp_path / "job").exists()  # nothing started


def test_empty_recordio_file_set(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(REPO / "tests/testdata/recordio/zero_records.rio", empty / "part-0.rio")
    code, err = train(capsys, data=empty, tmp=tmp_path)
    assert code == 2
    assert "no records" in err and str(empty) in err


def test_module_without_loss(capsys, tmp_path, data):
    module = tmp_path / "noloss.py"
    source = (REPO / "model_zoo/digits_torch.py").read_text().replace("def loss(", "def not_loss(")
    module.write_text(source)
    code, err = train(capsys, data=data, model=f"{module}:Model", tmp=tmp_path)
    assert code == 2
    assert str(module) in err and "no `loss`" in err and "loss(labels, predictions)" in err


def test_model_def_naming_no_callable(capsys, tmp_path, data):
    code, err = train(capsys, data=data, model=str(REPO / "model_zoo/digits_torch.py"), tmp=tmp_path)
    assert code == 2
    assert "names no callable" in err


def test_model_def_naming_missing_callable(capsys, tmp_path, data):
    code, err = train(capsys, data=data, model=f"{REPO / 'model_zoo/digits_torch.py'}:Nope", tmp=tmp_path)
    assert code == 2
    assert "no `Nope`" in err


@pytest.mark.parametrize("flag,value,expected", [
    ("--workers", "0", "--workers must be a positive integer, got 0"),
    ("--global-batch-size", "0", "--global-batch-size must be a positive integer, got 0"),
    ("--global-batch-size", "-8", "--global-batch-size must be a positive integer, got -8"),
    ("--max-micro-batch", "0", "--max-micro-batch must be a positive integer"),
    ("--max-micro-batch", "big", "--max-micro-batch must be a positive integer or 'auto', got 'big'"),
    ("--epochs", "0", "--epochs must be a positive integer"),
])
def test_non_positive_numbers(capsys, tmp_path, data, flag, value, expected):
    code, err = train(capsys, flag, value, data=data, tmp=tmp_path)
    assert code == 2
    assert expected in err


@pytest.mark.parametrize("extra, expected", [
    (("--memory-limit", "-1"), "--memory-limit must be a number of bytes or a size such as '2GiB', got -1"),
    (("--memory-limit", "12parsecs"), "--memory-limit='12parsecs' is not a memory size"),
    (("--memory-limit", "0"), "--memory-limit must be a number of bytes or a size such as '2GiB', got 0"),
    (("--distribution-strategy", "ParameterServer", "--ps", "1"),
     "--max-micro-batch auto needs --distribution-strategy AllReduce"),
])
def test_bad_auto_micro_batch_settings(capsys, tmp_path, data, extra, expected):
    code, err = train(capsys, "--max-micro-batch", "auto", *extra, data=data, tmp=tmp_path)
    assert code == 2
    assert expected in err
    assert not (tmp_path / "job").exists()  # refused before anything started


def test_min_workers_above_max_workers(capsys, tmp_path, data):
    code, err = train(capsys, "--workers", "2", "--min-workers", "3", "--max-workers", "2", data=data, tmp=tmp_path)
    assert code == 2
    assert "--min-workers (3) is greater than --max-workers (2)" in err


def test_train_help_reads_like_torchrun(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model-def", "--training-data", "--workers", "--global-batch-size", "--max-micro-batch",
                 "--lr", "--job-dir", "--epochs"):
        assert flag in out


def test_status_of_unknown_job(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["status", "nosuchjob"]) == 2
    assert capsys.readouterr().err == ("flextrain: error: no job 'nosuchjob': neither nosuchjob/status.json nor "
                                       "flextrain-jobs/nosuchjob/status.json exists\n")
    assert main(["status", str(tmp_path / "gone")]) == 2  # an absolute path: the one place looked at, once
    assert capsys.readouterr().err == (f"flextrain: error: no job {str(tmp_path / 'gone')!r}: "
                                       f"{tmp_path / 'gone' / 'status.json'} does not exist\n")


@pytest.mark.parametrize("model_def,expected", [
    ("model_zoo/deepfm_torch.py:Model", "deepfm-torch"),
    ("model_zoo.digits_torch.Model", "digits-torch"),
    ("pkg.mod:Model", "mod"),
])
def test_default_job_name_is_the_module_name(model_def, expected):
    from flextrain.cli import make_parser
    from flextrain.cli.common import job_name

    args = make_parser().parse_args(["train", "--model-def", model_def, "--training-data", "d"])
    assert job_name(args) == expected


# ---- --accelerate: refused at submission, before anything starts, naming the method, the file or the module ----
@pytest.mark.parametrize("value, needles", [
    ("amp_natve:bf16", ["--accelerate: unknown optimization method 'amp_natve'", "did you mean 'amp_native'"]),
    ("amp_native:bf16,zero2", ["--accelerate: zero2 (", "is data parallelism, which is flextrain's own in a job"]),
    ("fsdp", ["--accelerate: fsdp (", "use it in a script job (flextrain run)"]),
    ("amp_native", ["amp_native with fp16 (also its default", "use amp_native:bf16"]),
    ("half:bf17", ["--accelerate: config of 'half' needs dtype 'fp16' or 'bf16'"]),
])
def test_bad_accelerate_methods(capsys, tmp_path, data, value, needles):
    code, err = train(capsys, "--accelerate", value, data=data, tmp=tmp_path)
    assert code == 2
    for needle in needles:
        assert needle in err
    assert not (tmp_path / "job").exists()


def test_bad_accelerate_files_are_named(capsys, tmp_path, data):
    missing = tmp_path / "missing.json"
    code, err = train(capsys, "--accelerate", str(missing), data=data, tmp=tmp_path)
    assert code == 2 and f"cannot read strategy file {str(missing)!r}" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "flextrain.accelerate.strategy/1", "methods": [')
    code, err = train(capsys, "--accelerate", str(broken), data=data, tmp=tmp_path)
    assert code == 2 and f"--accelerate {broken} ({broken}) is not a JSON strategy" in err
    sharded = tmp_path / "sharded.json"
    sharded.write_text('["parallel_mode", "fsdp2"]')
    code, err = train(capsys, "--accelerate", str(sharded), data=data, tmp=tmp_path)
    assert code == 2 and f"--accelerate {sharded}: fsdp2 (" in err
    assert not (tmp_path / "job").exists()


def test_accelerate_with_parameter_servers_is_refused(capsys, tmp_path, data):
    code, err = train(capsys, "--accelerate", "auto", "--distribution-strategy", "ParameterServer", "--ps", "1",
                      data=data, tmp=tmp_path)
    assert code == 2 and "--accelerate needs --distribution-strategy AllReduce" in err
    assert not (tmp_path / "job").exists()


def test_an_accelerate_file_travels_in_the_job_as_json(tmp_path):
    """The workers (pods too) may not see the file: its strategy goes into the JobSpec, checked."""
    from flextrain.accelerate import Strategy
    from flextrain.cli.train import accelerate_in_spec
    from flextrain.job import JobSpec

    path = Strategy([("amp_native", "bf16"), ("checkpoint", ("Linear",))]).save(tmp_path / "fast.json")
    spec = JobSpec.of(name="j", model_def=DIGITS_MODEL, job_dir=str(tmp_path / "job"), training_data="d",
                      accelerate=str(path)).validate()
    inline = accelerate_in_spec(spec)
    assert Strategy.load(inline.training.accelerate) == Strategy.load(path)
    assert accelerate_in_spec(inline) == inline  # a resume reads it again: unchanged
    as_list = spec.replace(accelerate="amp_native:bf16")
    assert accelerate_in_spec(as_list) is as_list


@pytest.mark.parametrize("flags", [(), ("--json",)], ids=["summary", "json"])
def test_status_into_a_closed_pipe_ends_quietly(tmp_path, flags):
    """`flextrain status JOB | head`: a reader gone is no error worth a traceback (exit 141, as on SIGPIPE)."""
    import json
    import subprocess

    from ft_helpers import flextrain_cmd

    (tmp_path / "status.json").write_text(json.dumps({
        "name": "job", "phase": "Succeeded", "jobDir": str(tmp_path), "epoch": 1, "epochs": 2, "step": 3,
        "metrics": {}, "workers": {"active": 0, "desired": 2},
        "progress": {"recordsDone": 4, "recordsTotal": 4, "percent": 100.0}}))
    proc = subprocess.Popen(flextrain_cmd("status", str(tmp_path), *flags), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before it writes anything: its first write meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == "", err
