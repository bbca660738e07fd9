"""ParameterServer jobs end to end: `flextrain train --distribution-strategy ParameterServer`.

Real master, PS and worker processes on loopback, the DeepFM-style CTR model
on the synthetic click log (`flextrain data ctr`), whose majority class
(no click) is about 70 % of the records.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ft_helpers import MODEL_ZOO, flextrain_cmd, read_status, run_flextrain, wait_for

pytestmark = pytest.mark.e2e

DEEPFM_MODEL = f"{MODEL_ZOO / 'deepfm_torch.py'}:Model"
ROWS = 10000


@pytest.fixture(scope="module")
def ctr_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ctr")
    proc = run_flextrain("data", "ctr", "--out", str(out), "--rows", str(ROWS), "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    return out


def _train_args(ctr_data: Path, job_dir: Path, *extra: str) -> list[str]:
    return ["train", "--model-def", DEEPFM_MODEL, "--training-data", str(ctr_data / "train"),
            "--validation-data", str(ctr_data / "validation"), "--distribution-strategy", "ParameterServer",
            "--ps", "2", "--workers", "2", "--global-batch-size", "128", "--epochs", "2",
            "--lr", "0.02", "--job-dir", str(job_dir), *extra]


def test_ps_job_trains_ctr_model_above_majority_rate(ctr_data, tmp_path):
    job_dir = tmp_path / "job"
    started = time.monotonic()
    proc = run_flextrain(*_train_args(ctr_data, job_dir), timeout=120)
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 2 * 8000
    assert status["metrics"]["accuracy"] > 0.74, status["metrics"]  # majority class: ~0.70
    assert status["metrics"]["logloss"] < 0.55, status["metrics"]
    logs = sorted(p.name for p in (job_dir / "logs").glob("*.log"))
    assert logs == ["ps-0.log", "ps-1.log", "worker-0.log", "worker-1.log"]
    # each PS wrote checkpoints of its own shard
    for i in range(2):
        assert list((job_dir / "ps-checkpoints" / f"ps-{i}").glob("*.ckpt")), f"no checkpoint of ps-{i}"
    assert time.monotonic() - started < 90


def _pid_with(*needles: str) -> int | None:
    """The pid of the process whose command line holds every one of ``needles`` (this job's only)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(n.encode() in cmdline for n in needles):
                return int(entry.name)
    return None


def _ps_pid(address_file: Path) -> int | None:
    """The pid of the PS process started with ``--address-file address_file``."""
    return _pid_with(str(address_file))


def test_killed_ps_is_relaunched_and_job_completes(ctr_data, tmp_path):
    job_dir = tmp_path / "job"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(flextrain_cmd(*_train_args(ctr_data, job_dir, "--ps-checkpoint-steps", "5")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(lambda: (job_dir / "status.json").is_file() and read_status(job_dir)["progress"]["recordsDone"] > 2000,
                 timeout=60, what="training under way")
        pid = _ps_pid(job_dir / "ps" / "ps-0.addr")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: (p := _ps_pid(job_dir / "ps" / "ps-0.addr")) is not None and p != pid,
                 timeout=20, what="ps-0 relaunched")
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"]
    assert status["metrics"]["accuracy"] > 0.72, status["metrics"]
    # the relaunched PS listened on the same address, starting from its checkpoint, not from scratch
    starts = re.findall(r"PS 0/2 listening on (\S+) \(version (\d+)", (job_dir / "logs" / "ps-0.log").read_text())
    assert len(starts) == 2, starts
    assert starts[0][0] == starts[1][0]
    assert int(starts[0][1]) == 0 and int(starts[1][1]) >= 5


def test_killed_worker_is_replaced_and_every_record_is_counted_once(ctr_data, tmp_path):
    job_dir = tmp_path / "job"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(flextrain_cmd(*_train_args(ctr_data, job_dir, "--steps-per-task", "20")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        status = wait_for(lambda: (job_dir / "status.json").is_file() and
                          (s := read_status(job_dir))["progress"]["recordsDone"] > 0 and s,
                          timeout=60, what="training under way")
        pid = _pid_with("--master", status["masterAddress"], "--worker-id", "worker-0")
        assert pid is not None
        time.sleep(1.0)  # in the middle of its second task
        os.kill(pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 2 * 8000
    assert (job_dir / "logs" / "worker-2.log").is_file()  # the replacement
    assert status["metrics"]["accuracy"] > 0.72, status["metrics"]


def test_parameter_server_without_ps_is_a_clear_error(ctr_data, tmp_path):
    proc = run_flextrain("train", "--model-def", DEEPFM_MODEL, "--training-data", str(ctr_data / "train"),
                         "--distribution-strategy", "ParameterServer", "--job-dir", str(tmp_path / "job"),
                         timeout=60)
    assert proc.returncode == 2
    assert "--ps" in proc.stderr and "ParameterServer" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "job" / "status.json").exists()
