"""In-memory ("flash") checkpoints end to end (``--memory-checkpoint-steps``), with the counting
model: a job whose workers (and master) are SIGKILLed resumes from the newest snapshot, redoing at
most N steps, every record still applied exactly once; a stop leaves its checkpoint at once; the
job's shared memory is gone when the job ends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

from flextrain.elastic.flash import ENV_ROOT, FlashStore, flash_dir
from ft_helpers import (COUNTING_MODEL, counting_data, finish, flextrain_cmd, read_status, run_flextrain, seen_counts,
                        wait_for)

G = 32
EVERY = 5
STEPS_PER_EPOCH = 1408 // G


def _env(tmp_path):
    return {**os.environ, "FT_COUNT_G": str(G), "FT_FEED_DELAY": "0.01", ENV_ROOT: str(tmp_path / "shm")}


def _start(data, job_dir, env, *extra):
    cmd = flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data),
                        "--global-batch-size", str(G), "--max-micro-batch", "8", "--lr", "0.05",
                        "--job-dir", str(job_dir), "--workers", "2", "--memory-checkpoint-steps", str(EVERY),
                        "--no-progress", *extra)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _flash(job_dir, env) -> FlashStore:
    old = os.environ.get(ENV_ROOT)
    os.environ[ENV_ROOT] = env[ENV_ROOT]
    try:
        return FlashStore(flash_dir(job_dir.name, job_dir))
    finally:
        if old is None:
            os.environ.pop(ENV_ROOT)
        else:
            os.environ[ENV_ROOT] = old


def _newest(flash: FlashStore) -> int:
    snap, _ = flash.latest()
    return snap.version if snap else -1


def _members(job_dir):
    s = read_status(job_dir) if (job_dir / "status.json").exists() else None
    return s["roundHistory"][-1]["members"] if s and s["roundHistory"] and s["phase"] == "Running" else None


def test_job_killed_with_its_master_resumes_from_the_memory_snapshot_exactly_once(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir, env, epochs = tmp_path / "job", _env(tmp_path), 6
    proc = _start(data, job_dir, env, "--epochs", str(epochs))
    flash = _flash(job_dir, env)
    try:
        wait_for(lambda: _newest(flash) >= 4 * EVERY and _members(job_dir), timeout=180, what="a few snapshots")
        members = _members(job_dir)
        proc.send_signal(signal.SIGKILL)  # the master first: nobody flushes but the resume
        for m in members:
            os.kill(m["pid"], signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    killed_at = _newest(flash)  # the newest complete snapshot the dead job left in shared memory
    assert killed_at >= 4 * EVERY and killed_at % EVERY == 0

    resumed = subprocess.run(flextrain_cmd("train", "--resume", str(job_dir), "--no-progress"),
                             capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr
    events = read_status(job_dir)["events"]
    assert any(f"resumed from {job_dir / 'checkpoints'}/ckpt-{killed_at:09d}.ckpt (step {killed_at})" in e
               for e in events), events
    seen, version = seen_counts(job_dir)
    assert version == epochs * STEPS_PER_EPOCH
    assert seen.min().item() == seen.max().item() == epochs  # every record once per epoch, through the kill
    assert not flash.path.exists()  # the job's shared memory went with it


def test_every_worker_killed_relaunched_workers_continue_from_the_snapshot(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir, env, epochs = tmp_path / "job", _env(tmp_path), 6
    proc = _start(data, job_dir, env, "--epochs", str(epochs))
    flash = _flash(job_dir, env)
    try:
        wait_for(lambda: _newest(flash) >= 3 * EVERY and _members(job_dir), timeout=180, what="a few snapshots")
        before = _newest(flash)
        for m in _members(job_dir):
            os.kill(m["pid"], signal.SIGKILL)
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err
    final = read_status(job_dir)
    rollback = [e for e in final["events"] if "no worker of the last round survived" in e]
    assert rollback, final["events"]
    step = int(re.search(r"ckpt-(\d+)", rollback[0]).group(1))
    assert step >= before and step % EVERY == 0  # at most N steps (and the time to kill) redone
    seen, version = seen_counts(job_dir)
    assert version == epochs * STEPS_PER_EPOCH
    assert seen.min().item() == seen.max().item() == epochs
    assert not flash.path.exists()


def test_stop_leaves_its_checkpoint_at_once_and_no_shared_memory(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir, env = tmp_path / "job", _env(tmp_path)
    proc = _start(data, job_dir, env, "--epochs", "40")
    flash = _flash(job_dir, env)
    try:
        wait_for(lambda: _newest(flash) >= 2 * EVERY, timeout=180, what="a snapshot")
        stop = run_flextrain("stop", str(job_dir))
        assert stop.returncode == 0, stop.stderr
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1, err
    stopped = read_status(job_dir)
    latest = json.loads((job_dir / "checkpoints" / "latest.json").read_text())
    assert f"checkpoint at step {latest['version']}" in stopped["message"], stopped["message"]
    seen, version = seen_counts(job_dir, latest["checkpoint"])
    assert version == latest["version"] >= 2 * EVERY
    assert not flash.path.exists() and not list((tmp_path / "shm").glob("flextrain-*"))
