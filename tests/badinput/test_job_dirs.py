"""Job directories are guarded: no new run over an old job, one master at a time, clear environment errors.

Refusals run in-process (``flextrain.cli.main``): they happen before anything
is written or started. Only the finished job and the ``--overwrite`` run are
real ``flextrain train`` processes (1 worker, 1 epoch).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flextrain.cli import main
from flextrain.master.jobdir import JobDirError, JobDirLock, guard, holder, inspect
from badinput_support import run_without_dac_override
from ft_helpers import DIGITS_MODEL, read_status, run_flextrain

SMALL = ("--workers", "1", "--epochs", "1", "--global-batch-size", "64", "--no-preflight")


def train_args(digits_data: Path, job_dir: Path, *extra: str) -> list[str]:
    return ["train", "--model-def", DIGITS_MODEL, "--training-data", str(digits_data / "train"), *SMALL,
            "--job-dir", str(job_dir), *extra]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refusal(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("flextrain: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def finished_job(digits_data, tmp_path_factory) -> Path:
    job_dir = tmp_path_factory.mktemp("finished") / "job"
    proc = run_flextrain(*train_args(digits_data, job_dir))
    assert proc.returncode == 0, proc.stderr
    assert read_status(job_dir)["phase"] == "Succeeded"
    return job_dir


def test_a_finished_job_is_refused_for_a_new_run_and_left_untouched(capsys, digits_data, finished_job):
    before = snapshot(finished_job)
    err = refusal(capsys, train_args(digits_data, finished_job))
    step = read_status(finished_job)["step"]
    for part in ("already holds a job", "phase Succeeded", f"step {step}", str(finished_job / "checkpoints"),
                 "final.ckpt", f"--resume {finished_job}", "--overwrite"):
        assert part in err, (part, err)
    assert snapshot(finished_job) == before
    assert not list(finished_job.glob("previous-*"))


def test_overwrite_moves_the_old_job_aside_and_trains_despite_a_stale_lock(digits_data, finished_job, tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(finished_job, job_dir)
    old_final = (job_dir / "checkpoints" / "final.ckpt").read_bytes()
    old_status = (job_dir / "status.json").read_bytes()
    # A master that died holding the lock: its pid and host stay in the file, the kernel dropped the lock.
    holder_proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom flextrain.master.jobdir import "
                                    f"JobDirLock\nJobDirLock({str(job_dir)!r}).acquire()\nprint('locked', flush=True)\n"
                                    "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    assert holder_proc.stdout.readline().strip() == "locked"
    assert holder(job_dir) == f"pid {holder_proc.pid} on host {os.uname().nodename}"
    holder_proc.send_signal(signal.SIGKILL)
    holder_proc.wait(timeout=10)
    assert (job_dir / ".lock").read_text().split()[0] == str(holder_proc.pid) and holder(job_dir) is None

    proc = run_flextrain(*train_args(digits_data, job_dir, "--overwrite"))
    assert proc.returncode == 0, proc.stderr
    aside = list(job_dir.glob("previous-*"))
    assert len(aside) == 1 and f"moved to {aside[0]}" in proc.stderr
    assert (aside[0] / "checkpoints" / "final.ckpt").read_bytes() == old_final
    assert (aside[0] / "status.json").read_bytes() == old_status
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded" and (job_dir / "checkpoints" / "final.ckpt").is_file()
    assert any(str(aside[0]) in event for event in status.get("events", [])) or str(aside[0]) in status["message"]
    assert inspect(aside[0]).phase == "Succeeded"


def stopped_job(job_dir: Path, phase: str = "Failed") -> Path:
    """What a job stopped with Ctrl-C leaves: its status and a checkpoint that is not final."""
    (job_dir / "checkpoints").mkdir(parents=True)
    (job_dir / "jobspec.json").write_text("{}\n")
    (job_dir / "status.json").write_text(json.dumps({
        "phase": phase, "step": 24, "message": f"stopped: interrupted; checkpoint at step 24: resume with "
                                              f"`flextrain train --resume {job_dir}`"}))
    (job_dir / "checkpoints" / "latest.json").write_text(json.dumps({
        "checkpoint": str(job_dir / "checkpoints" / "ckpt-000000024.ckpt"), "version": 24, "final": False,
        "ledger": str(job_dir / "checkpoints" / "ledger-000000024.json")}))
    return job_dir


def test_repeating_the_command_of_a_stopped_job_says_how_to_resume_it(capsys, digits_data, tmp_path):
    job_dir = stopped_job(tmp_path / "job")
    before = snapshot(job_dir)
    err = refusal(capsys, train_args(digits_data, job_dir))
    assert f"resume with `flextrain train --resume {job_dir}`" in err
    assert "phase Failed, step 24" in err and "ckpt-000000024.ckpt" in err and "--overwrite" in err
    assert snapshot(job_dir) == before


def test_a_crashed_master_is_named_as_gone(capsys, digits_data, tmp_path):
    job_dir = stopped_job(tmp_path / "job", phase="Running")
    err = refusal(capsys, train_args(digits_data, job_dir))
    assert "phase Running (its master is gone)" in err and f"--resume {job_dir}" in err
    guard(job_dir, resume=True)  # nobody holds the lock: a resume may go ahead


def test_damaged_files_are_named_not_raised(capsys, digits_data, tmp_path):
    job_dir = stopped_job(tmp_path / "job")
    (job_dir / "status.json").write_text("{half a")
    err = refusal(capsys, train_args(digits_data, job_dir))
    assert f"unreadable: {job_dir / 'status.json'}" in err and "step 24" in err


def test_a_locked_directory_is_refused_naming_the_holder(capsys, digits_data, tmp_path):
    job_dir = stopped_job(tmp_path / "job")
    with JobDirLock(job_dir):
        for extra in ((), ("--overwrite",)):
            err = refusal(capsys, train_args(digits_data, job_dir, *extra))
            assert f"in use by a running master (pid {os.getpid()} on host {os.uname().nodename})" in err
        with pytest.raises(JobDirError, match=f"pid {os.getpid()}"):
            guard(job_dir, resume=True)
        from flextrain.job import JobSpec
        from flextrain.master.main import run_master

        spec = JobSpec.of(name="j", model_def=DIGITS_MODEL, training_data=str(digits_data / "train"),
                       job_dir=str(job_dir)).validate()
        with pytest.raises(JobDirError, match=f"pid {os.getpid()}"):  # the master itself, past the CLI
            run_master(spec, resume=True)
    assert holder(job_dir) is None and (job_dir / ".lock").read_text() == ""


def test_resume_and_overwrite_together_are_refused(capsys, tmp_path):
    job_dir = stopped_job(tmp_path / "job")
    assert "contradict" in refusal(capsys, ["train", "--resume", str(job_dir), "--overwrite"])


@pytest.mark.parametrize("where", ["file", "under-file", "unwritable"])
def test_an_unusable_job_dir_is_one_line_exit_2(capsys, digits_data, tmp_path, where):
    if where == "unwritable" and os.geteuid() == 0:  # root writes through file modes: drop that capability
        blocker = tmp_path / "blocker"
        blocker.mkdir(mode=0o500)
        proc = run_without_dac_override(*train_args(digits_data, blocker / "job"))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"flextrain: error: job directory {blocker / 'job'} cannot be created: "
                                      f"{blocker} is not writable (permission denied)"), proc.stderr
        assert list(blocker.iterdir()) == []
        return
    blocker = tmp_path / "blocker"
    if where == "unwritable":
        blocker.mkdir(mode=0o500)
        job_dir, problem = blocker / "job", f"{blocker} is not writable"
    else:
        blocker.write_text("x")
        job_dir, problem = ((blocker, "is a file") if where == "file"
                            else (blocker / "job", f"lies under {blocker}, which is a file"))
    err = refusal(capsys, train_args(digits_data, job_dir))
    assert f"job directory {job_dir}" in err and problem in err, err
    assert blocker.read_text() == "x" if blocker.is_file() else not job_dir.exists()


def test_evaluate_into_a_directory_holding_a_job_is_refused(capsys, digits_data, finished_job, tmp_path):
    job_dir = stopped_job(tmp_path / "job")
    err = refusal(capsys, ["evaluate", "--model-def", DIGITS_MODEL, "--checkpoint", str(finished_job),
                           "--validation-data", str(digits_data / "validation"), "--job-dir", str(job_dir)])
    assert "already holds a job" in err and "--overwrite" in err and "--resume" not in err


def test_overwrite_of_a_ps_job_starts_its_parameter_servers_afresh(digits_data, tmp_path, capsys):
    """PS mode: the old PS state is moved aside with the rest; the new PS count every record once, not twice."""
    from ft_helpers import counting_data, ps_counts

    records = 256
    data = counting_data(digits_data, tmp_path / "data", records=records)
    job_dir = tmp_path / "job"
    argv = ["train", "--model-def", f"{Path(__file__).resolve().parents[1] / 'e2e' / 'zoo' / 'counting_ps.py'}:Model",
            "--training-data", str(data), "--distribution-strategy", "ParameterServer", "--ps", "2",
            "--workers", "1", "--global-batch-size", "32", "--lr", "32", "--epochs", "1", "--no-preflight",
            "--job-dir", str(job_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FT_COUNT_RECORDS": str(records)}

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "flextrain", *argv, *extra], capture_output=True, text=True,
                              env=env, timeout=180)

    first = run()
    assert first.returncode == 0, first.stderr
    err = refusal(capsys, argv)
    assert "ps-checkpoints" in err and "--overwrite" in err
    second = run("--overwrite")
    assert second.returncode == 0, second.stderr
    aside = list(job_dir.glob("previous-*"))
    assert len(aside) == 1 and (aside[0] / "ps-checkpoints").is_dir() and (aside[0] / "ps-ledger.json").is_file()
    dense, rows = ps_counts(job_dir, records)
    assert dense.tolist() == [1.0] * records and rows.tolist() == [1.0] * records  # not restored: afresh
