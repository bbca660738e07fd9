"""Every numeric flag is checked by one rule per kind, before anything starts, in one line that names it.

Kinds (flextrain.job): counts are integers >= 1, budgets and step intervals integers >= 0,
timeouts and the learning rate positive and finite. Runs the real CLI entry in-process.
"""

from __future__ import annotations

import argparse
import json
import os

import pytest

from ft_helpers import DIGITS_MODEL
from flextrain.cli import main, make_parser


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def train(capsys, tmp_path, data, *extra: str) -> tuple[int, str]:
    return run(capsys, "train", "--model-def", DIGITS_MODEL, "--training-data", str(data),
               "--job-dir", str(tmp_path / "job"), *extra)


def assert_refused(code: int, err: str, expected: str, tmp_path) -> None:
    assert code == 2, err
    assert err == f"flextrain: error: {expected}\n"  # one line, naming flag and value
    assert not (tmp_path / "job").exists()  # nothing started


@pytest.fixture
def data(digits_data):
    return digits_data / "train"


POSITIVE_FINITE = "must be positive and finite, got"
NON_NEGATIVE = "must be an integer >= 0, got"


@pytest.mark.parametrize("flags, expected", [
    # timeouts: 0 expires at once, a negative one too, inf never fires, nan compares false
    (["--worker-timeout", "0"], f"--worker-timeout {POSITIVE_FINITE} 0.0"),
    (["--worker-timeout", "-1"], f"--worker-timeout {POSITIVE_FINITE} -1.0"),
    (["--worker-timeout", "inf"], f"--worker-timeout {POSITIVE_FINITE} inf"),
    (["--rendezvous-timeout", "0"], f"--rendezvous-timeout {POSITIVE_FINITE} 0.0"),
    (["--rendezvous-timeout", "-5"], f"--rendezvous-timeout {POSITIVE_FINITE} -5.0"),
    (["--rendezvous-timeout", "nan"], f"--rendezvous-timeout {POSITIVE_FINITE} nan"),
    (["--min-workers-timeout", "0"], f"--min-workers-timeout {POSITIVE_FINITE} 0.0"),
    (["--min-workers-timeout", "-1"], f"--min-workers-timeout {POSITIVE_FINITE} -1.0"),
    (["--min-workers-timeout", "inf"], f"--min-workers-timeout {POSITIVE_FINITE} inf"),
    # budgets and step intervals
    (["--relaunch-budget", "-1"], f"--relaunch-budget {NON_NEGATIVE} -1"),
    (["--max-task-retries", "-1"], f"--max-task-retries {NON_NEGATIVE} -1"),
    (["--checkpoint-steps", "-1"], f"--checkpoint-steps {NON_NEGATIVE} -1"),
    (["--ps-checkpoint-steps", "-3"], f"--ps-checkpoint-steps {NON_NEGATIVE} -3"),
    (["--ps", "-1"], f"--ps {NON_NEGATIVE} -1"),
    # counts
    (["--steps-per-task", "0"], "--steps-per-task must be a positive integer, got 0"),
    (["--grads-to-wait", "0"], "--grads-to-wait must be a positive integer, got 0"),
    (["--min-workers", "0"], "--min-workers must be a positive integer, got 0"),
    # floats
    (["--lr", "inf"], f"--lr {POSITIVE_FINITE} inf"),
    (["--lr", "nan"], f"--lr {POSITIVE_FINITE} nan"),
    (["--lr", "-0.1"], f"--lr {POSITIVE_FINITE} -0.1"),
    (["--seed", "-1"], "--seed must be an integer from 0 to 2**63-1, got -1"),
    (["--bucket-mb", "-1"], "--bucket-mb must be a number of MiB >= 0 (0: one flat reduction after backward), "
                            "got -1.0"),
    (["--bucket-mb", "inf"], "--bucket-mb must be a number of MiB >= 0 (0: one flat reduction after backward), "
                             "got inf"),
    # relations blame the flags that were given
    (["--workers", "3", "--max-workers", "2"], "--workers (3) is greater than --max-workers (2)"),
    (["--min-workers", "2"], "--min-workers (2) is greater than --workers (1)"),
    (["--workers", "2", "--min-workers", "3", "--max-workers", "2"],
     "--min-workers (3) is greater than --max-workers (2)"),
    (["--workers", "5", "--min-workers", "1", "--max-workers", "4"],
     "--workers (5) must lie between --min-workers (1) and --max-workers (4)"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_train_flag_is_refused(capsys, tmp_path, data, flags, expected):
    assert_refused(*train(capsys, tmp_path, data, *flags), expected, tmp_path)


def test_resume_with_a_worker_count_outside_the_stored_range(capsys, tmp_path):
    from flextrain.job import JobSpec

    job = tmp_path / "old"
    job.mkdir()
    spec = JobSpec.of(name="old", model_def=DIGITS_MODEL, training_data=str(tmp_path), job_dir=str(job), max_workers=2)
    (job / "jobspec.json").write_text(spec.to_json())
    code, err = run(capsys, "train", "--resume", str(job), "--workers", "3")
    assert_refused(code, err, "--workers (3) is greater than --max-workers (2)", tmp_path)


def test_model_def_naming_a_directory(capsys, tmp_path, data):
    models = tmp_path / "models"
    models.mkdir()
    code, err = train(capsys, tmp_path, data, "--model-def", f"{models}:Model")
    assert_refused(code, err, f"--model-def '{models}:Model': {models} is a directory, not a module file "
                              "(expected path/to/module.py:Name)", tmp_path)


def test_training_data_that_is_a_missing_file_or_directory(capsys, tmp_path):
    code, err = train(capsys, tmp_path, tmp_path / "gone.rio")
    assert_refused(code, err, f"training data file not found: {tmp_path / 'gone.rio'}", tmp_path)
    code, err = train(capsys, tmp_path, tmp_path / "gone")
    assert_refused(code, err, f"training data directory not found: {tmp_path / 'gone'}", tmp_path)


@pytest.mark.parametrize("command, flags, expected", [
    ("evaluate", ["--worker-timeout", "0"], f"--worker-timeout {POSITIVE_FINITE} 0.0"),
    ("evaluate", ["--relaunch-budget", "-1"], f"--relaunch-budget {NON_NEGATIVE} -1"),
    ("predict", ["--workers", "0"], "--workers must be a positive integer, got 0"),
    ("predict", ["--max-task-retries", "-2"], f"--max-task-retries {NON_NEGATIVE} -2"),
])
def test_evaluate_and_predict_flags(capsys, tmp_path, command, flags, expected):
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"never read: the flags are refused first")
    data = ["--validation-data", str(tmp_path)] if command == "evaluate" else \
        ["--prediction-data", str(tmp_path), "--output", str(tmp_path / "out")]
    code, err = run(capsys, command, "--model-def", DIGITS_MODEL, "--checkpoint", str(ckpt), *data,
                    "--job-dir", str(tmp_path / "job"), *flags)
    assert_refused(code, err, expected, tmp_path)
    assert not (tmp_path / "out").exists()


def test_kubernetes_dry_run_checks_the_same_rules(capsys, tmp_path):
    code, err = run(capsys, "train", "--backend", "kubernetes", "--dry-run", "--model-def", "m.py:Model",
                    "--training-data", "/data", "--job-dir", str(tmp_path / "job"), "--rendezvous-timeout", "-5")
    assert_refused(code, err, f"--rendezvous-timeout {POSITIVE_FINITE} -5.0", tmp_path)


def test_operator_sweep_interval(capsys, tmp_path):
    code, err = run(capsys, "operator", "--sweep-interval", "0")
    assert_refused(code, err, f"--sweep-interval {POSITIVE_FINITE} 0.0", tmp_path)


def test_data_validation_fraction(capsys, tmp_path):
    code, err = run(capsys, "data", "digits", "--out", str(tmp_path / "job"), "--validation-fraction", "1.5")
    assert_refused(code, err, "--validation-fraction must be between 0 and 1 (exclusive), got 1.5", tmp_path)


@pytest.mark.parametrize("kind", ["digits", "ctr"])
def test_data_out_that_is_a_file(capsys, tmp_path, kind):
    (tmp_path / "afile").write_text("")
    code, err = run(capsys, "data", kind, "--out", str(tmp_path / "afile"))
    assert code == 2 and err == (f"flextrain: error: --out {tmp_path / 'afile'} exists and is not a directory (the "
                                 f"data set is written as {tmp_path / 'afile' / 'train'} and "
                                 f"{tmp_path / 'afile' / 'validation'})\n")


def test_non_number_is_argparses_error(capsys, tmp_path, data):
    with pytest.raises(SystemExit) as exc:
        train(capsys, tmp_path, data, "--worker-timeout", "soon")
    assert exc.value.code == 2
    assert "--worker-timeout: invalid float value: 'soon'" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()


# ---- scale: a refusal is printed once -------------------------------------------------------
@pytest.fixture
def master(tmp_path):
    """A job directory whose status.json points at a real master gRPC server that accepts 1..2 workers."""
    from flextrain.master.servicer import MasterServicer, start_server

    def scale(workers: int) -> tuple[bool, str]:
        if not 1 <= workers <= 2:
            return False, f"cannot scale to {workers} workers: the job allows 1..2 (--min-workers/--max-workers)"
        return True, f"scaling to {workers} workers"

    servicer = MasterServicer(None, status_json=lambda: "{}", stop=lambda reason: (True, ""), scale=scale,
                              heartbeat_interval=1.0)
    server, port = start_server(servicer, host="127.0.0.1", port=0, threads=2)
    job = tmp_path / "running"
    job.mkdir()
    (job / "status.json").write_text(json.dumps({"name": "running", "phase": "Running", "pid": os.getpid(),
                                                 "masterAddress": f"127.0.0.1:{port}"}))
    yield job
    server.stop(None)


def test_scale_refusal_is_printed_once(capsys, master):
    assert main(["scale", str(master), "5"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "flextrain: error: cannot scale to 5 workers: the job allows 1..2 (--min-workers/--max-workers)\n"
    assert main(["scale", str(master), "2"]) == 0
    assert capsys.readouterr() == ("scaling to 2 workers\n", "")


# ---- help ---------------------------------------------------------------------------------------
def _parsers(parser: argparse.ArgumentParser, name: str = "flextrain"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_option_has_help():
    missing = [f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
               for name, parser in _parsers(make_parser()) for action in parser._actions
               if not isinstance(action, argparse._SubParsersAction) and action.nargs != argparse.REMAINDER
               and not (action.help or "").strip()]
    assert missing == []


@pytest.mark.parametrize("command", ["train", "evaluate", "predict", "data digits", "data ctr"])
def test_help_states_each_default_once(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no default split over two lines
    with pytest.raises(SystemExit) as exc:
        main([*command.split(), "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    entries = [line for line in out.replace("\n                        ", " ").splitlines() if line.startswith("  -")]
    assert len(entries) > 3
    for entry in entries:
        assert entry.count("default") <= 1, entry
        assert "(default: None)" not in entry and "(default: False)" not in entry, entry
    if command == "train":
        assert any(e.startswith("  --epochs N ") and "passes over the training data (default: 1)" in e
                   for e in entries)
        assert any("number of workers to start (default: 1)" in e for e in entries)
