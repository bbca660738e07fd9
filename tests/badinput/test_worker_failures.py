"""The user's code fails inside the workers: the job fails fast with *their* error as its reason.

Each case is model_zoo/digits_torch.py with one thing broken only where the workers run it
(``FLEXTRAIN_WORKER_ID`` is set), so preflight passes and the real job meets the fault. Each
asserts the exit code (flextrain/failures.py), the ``failure`` object and message of
status.json, what ``flextrain train`` printed, that the job failed by its own error and not
by waiting out --min-workers-timeout, and that no process is left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from badinput_support import DIGITS_TORCH, IN_WORKER, line_of, module
from ft_helpers import processes_with_args, read_status, run_flextrain
from flextrain.failures import ExitCode

pytestmark = pytest.mark.e2e

def broken(tmp_path: Path, name: str, replace: dict[str, str]) -> Path:
    return module(tmp_path, name, replace, source=IN_WORKER + DIGITS_TORCH)


def run_job(tmp_path: Path, module: Path, data: Path, *extra: str):
    job_dir = tmp_path / "job"
    proc = run_flextrain("train", "--model-def", f"{module}:Model", "--training-data", str(data),
                         "--job-dir", str(job_dir), "--workers", "2", "--global-batch-size", "64",
                         "--min-workers-timeout", "600", "--no-progress", *extra, timeout=200)
    status = read_status(job_dir)
    assert status["phase"] == "Failed", proc.stderr
    assert "for 600s" not in status["message"]  # failed of its own error, not of waiting
    assert not _children_alive(status), "a worker outlived the job"
    return proc, status


def _children_alive(status: dict) -> list[int]:
    """Processes still running with this job's master address on their command line (its workers)."""
    return processes_with_args("--master", status["masterAddress"])


@pytest.fixture
def data(digits_data):
    return digits_data / "train"


def test_model_constructor_raising_in_every_worker_fails_fast_with_its_error(tmp_path, data):
    module = broken(tmp_path, "ctor", {"        super().__init__()\n": (
        "        super().__init__()\n"
        "        if IN_WORKER:\n"
        "            raise RuntimeError('cannot build model: missing vocab file')\n")})
    proc, status = run_job(tmp_path, module, data)
    assert proc.returncode == ExitCode.USER_CODE
    failure = status["failure"]
    assert failure["kind"] == "UserCode" and failure["exception"] == "RuntimeError"
    assert failure["message"] == "cannot build model: missing vocab file"
    assert failure["location"].startswith(f"{module}:{line_of(module, 'missing vocab')} in __init__")
    assert failure["stage"] == "starting" and failure["exitCode"] == 3
    assert "cannot build model: missing vocab file" in status["message"]
    assert "same failure again" in status["message"]
    # printed by `flextrain train`: the root cause, the user's line, the traceback's end
    assert "root cause: worker-" in proc.stderr and f"{module}:{line_of(module, 'missing vocab')}" in proc.stderr
    assert "raise RuntimeError('cannot build model: missing vocab file')" in proc.stderr
    # the worker's log holds the whole traceback
    log = Path(failure["log"]).read_text()
    assert "Traceback (most recent call last)" in log and "missing vocab file" in log


@pytest.mark.parametrize("name,replace,expected", [
    ("noparams", {"        self.net = nn.Sequential(": "        self.net = (lambda x: x) if IN_WORKER else nn.Sequential("},
     "parameter"),
    ("notmodule", {"class Model(nn.Module):": "class _Model(nn.Module):",
                   "\n\ndef loss(": "\n\ndef Model():\n    return 'a model' if IN_WORKER else _Model()\n\n\ndef loss("},
     "str"),
    ("optnone", {"    return torch.optim.SGD(params, lr=lr, momentum=0.9)":
                 "    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)\n    return None if IN_WORKER else opt"},
     "None"),
])
def test_a_module_breaking_its_contract_in_the_worker_fails_at_once(tmp_path, data, name, replace, expected):
    module = broken(tmp_path, name, replace)
    proc, status = run_job(tmp_path, module, data)
    assert proc.returncode == ExitCode.MODULE_CONTRACT, proc.stderr
    failure = status["failure"]
    assert failure["kind"] == "ModuleContract"
    assert str(module) in failure["message"] and expected in failure["message"]
    assert "no relaunch can fix it" in status["message"]
    assert len([e for e in status["events"] if "failed (exit code 4 (module contract))" in e]) >= 1


def test_sys_exit_in_forward_is_a_failure_naming_the_line(tmp_path, data):
    module = broken(tmp_path, "sysexit", {"        return self.net(x)":
                                          "        if IN_WORKER:\n            raise SystemExit(0)\n        return self.net(x)"})
    proc, status = run_job(tmp_path, module, data)
    assert proc.returncode == ExitCode.USER_CODE
    failure = status["failure"]
    assert failure["exception"] == "SystemExit" and "sys.exit(0)" in failure["message"]
    assert failure["location"].startswith(f"{module}:{line_of(module, 'raise SystemExit')} in forward")
    assert failure["stage"] == "training"


@pytest.mark.parametrize("code", [3, 0])
def test_os_exit_in_forward_is_an_unexpected_exit(tmp_path, data, code):
    module = broken(tmp_path, f"osexit{code}", {"        return self.net(x)":
                                                f"        if IN_WORKER:\n            os._exit({code})\n        return self.net(x)"})
    proc, status = run_job(tmp_path, module, data)
    assert proc.returncode == ExitCode.INTERNAL
    failure = status["failure"]
    assert failure["kind"] == "UnexpectedExit" and failure["exitCode"] == code
    assert f"exited with code {code} by itself" in status["message"]


def test_feed_failing_on_some_records_fails_after_retries_keeping_what_was_trained(tmp_path, data):
    module = broken(tmp_path, "feedfails", {"    pixels, labels = decode_digits(records)":
                                            "    if IN_WORKER and metadata.start >= 640:\n"
                                            "        raise ValueError(f'bad record at {metadata.start}')\n"
                                            "    pixels, labels = decode_digits(records)"})
    proc, status = run_job(tmp_path, module, data, "--checkpoint-steps", "4", "--max-task-retries", "1",
                           "--steps-per-task", "2")
    assert proc.returncode == ExitCode.USER_CODE
    assert "failed 2 times" in status["message"] and "ValueError: bad record at " in status["message"]
    assert f"{module}:{line_of(module, 'bad record at')}" in status["message"]
    assert status["failure"]["exception"] == "ValueError"
    assert status["progress"]["recordsDone"] == 640  # steps before the bad records were applied...
    assert list((tmp_path / "job" / "checkpoints").glob("ckpt-*.ckpt"))  # ... and kept
    logs = "".join(p.read_text() for p in (tmp_path / "job" / "logs").glob("worker-*.log"))
    assert "Traceback (most recent call last)" in logs and "raise ValueError(f'bad record at" in logs


def test_a_worker_that_hangs_starting_is_killed_and_named(tmp_path, data):
    module = broken(tmp_path, "hangs", {"        super().__init__()\n": (
        "        super().__init__()\n"
        "        if IN_WORKER:\n"
        "            import threading; threading.Event().wait()\n")})
    proc, status = run_job(tmp_path, module, data, "--start-timeout", "3")
    assert status["failure"]["kind"] == "Hang"
    assert "still not ready" in status["message"] and "--start-timeout 3s" in status["message"]
    assert "killing it" in proc.stderr
