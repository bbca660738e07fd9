"""A corrupt RecordIO chunk met during training: retried, then a clear job failure."""

from __future__ import annotations

import pytest

from ft_helpers import DIGITS_MODEL, read_status, run_flextrain
from flextrain.data import RecordIOReader, read_records, write_records

pytestmark = pytest.mark.e2e


def test_corrupt_chunk_fails_task_retries_then_job_names_file_and_offset(digits_data, tmp_path):
    records = read_records(next((digits_data / "train").glob("*.rio")))[:600]
    data = tmp_path / "data"
    data.mkdir()
    path = data / "part-0.rio"
    write_records(path, records, max_chunk_size=65 * 50)  # 50 records per chunk
    bad = RecordIOReader(path).chunks[7]  # records 350..399
    raw = bytearray(path.read_bytes())
    raw[bad.offset + 20 + 100] ^= 0xFF  # a payload byte: the chunk's CRC no longer matches
    path.write_bytes(bytes(raw))

    job_dir = tmp_path / "job"
    proc = run_flextrain(
        "train", "--model-def", DIGITS_MODEL, "--training-data", str(data), "--workers", "2",
        "--epochs", "1", "--global-batch-size", "50", "--steps-per-task", "4",
        "--max-task-retries", "2", "--job-dir", str(job_dir),
    )
    assert proc.returncode == 6, proc.stderr  # ExitCode.DATA
    status = read_status(job_dir)
    assert status["phase"] == "Failed"
    message = status["message"]
    assert str(path) in message
    assert f"byte offset {bad.offset}" in message
    assert "failed 3 times" in message  # first try + 2 retries
    # steps before the corrupt chunk were applied and are not part of the failed range; so was
    # the last task [400, 600), handed out (ahead) during the failing step, before the retries
    assert "records [350, 400)" in message
    assert status["progress"]["recordsDone"] == 600 - 50
    assert "Failed" in proc.stderr and str(path) in proc.stderr
