"""A disk that fills up under a running job, for real: a small tmpfs holds the job directory.

The job fails with a message naming the file and "No space left on device", leaves no temp
file, keeps its last good checkpoint (and a status.json a reader can parse), and once space
is freed ``--resume`` finishes it with every record applied exactly once. Mounting needs
privileges (root here and in CI); elsewhere the test is skipped, saying why.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from flextrain.master.checkpoints import CheckpointStore
from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, seen_counts, wait_for

G, RECORDS, EPOCHS = 32, 256, 40


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Write to ``path`` until the device is full."""
    with open(path, "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 16 or 1]


@pytest.mark.e2e
def test_a_disk_that_fills_up_fails_the_job_clearly_and_resume_finishes_it(digits_data, tmp_path, small_disk):
    data = counting_data(digits_data, tmp_path / "data", records=RECORDS)  # the data is not on the small disk
    job_dir = small_disk / "job"
    env = {**os.environ, "FT_COUNT_G": str(G), "PYTHONUNBUFFERED": "1"}
    common = ("--no-preflight", "--no-progress")
    proc = subprocess.Popen(flextrain_cmd(
        "train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size", str(G),
        "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "1", "--epochs", str(EPOCHS),
        "--checkpoint-steps", "2", *common), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(lambda: (job_dir / "checkpoints" / "latest.json").exists(), timeout=120, what="a checkpoint")
        fill(small_disk / "filler")
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode not in (0, None), err
    assert "No space left on device" in err, err
    status = read_status(job_dir)  # still a file a reader can parse, saying how the job ended
    assert status["phase"] == "Failed" and "No space left on device" in status["message"], status["message"]
    leftovers = [p for p in job_dir.rglob("*") if ".tmp" in p.name]
    assert not leftovers, leftovers
    store = CheckpointStore(job_dir / "checkpoints")
    latest, damaged = store.resume_point()  # the last good checkpoint is whole
    assert latest is not None and not damaged, damaged
    assert not latest["final"] and latest["version"] < EPOCHS * RECORDS // G

    (small_disk / "filler").unlink()
    resumed = subprocess.run(flextrain_cmd("train", "--resume", str(job_dir), *common), capture_output=True,
                             text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr
    seen, version = seen_counts(job_dir)
    assert version == EPOCHS * RECORDS // G
    assert seen[:RECORDS].min().item() == seen[:RECORDS].max().item() == EPOCHS  # each record once per epoch
    assert json.loads((job_dir / "history.jsonl").read_text().splitlines()[-1])["run"] == "resume"


def test_a_job_dir_on_a_full_disk_is_refused_at_submission(capsys, digits_data, small_disk):
    from flextrain.cli import main

    fill(small_disk / "filler")
    job_dir = small_disk / "job"
    assert main(["train", "--model-def", COUNTING_MODEL, "--training-data", str(digits_data / "train"),
                 "--job-dir", str(job_dir), "--no-preflight"]) == 2
    err = capsys.readouterr().err
    assert err == f"flextrain: error: job directory {job_dir}: no space left on its device\n", err
    assert sorted(os.listdir(small_disk)) == ["filler"]  # nothing was written
