"""Jobs whose module reads its own data through an ElasticDL-style ``custom_data_reader``.

(a) training and evaluation over ``.npz`` files, the shards named by the reader (``digits:0``..)
    and not files, reach the digits accuracy;
(b) with a worker killed mid-job, every record is still applied exactly once per epoch
    (the counting model, reading row dicts from the reader);
(c) a reader whose ``create_shards()`` raises is refused at submission, naming the exception,
    before any process starts; one whose ``read_records`` raises fails the job, naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flextrain.data import decode_digits, read_records
from ft_helpers import counted_exactly_once_through_a_kill, read_status, run_flextrain

pytestmark = pytest.mark.e2e

ZOO = Path(__file__).resolve().parent / "zoo"
READER_MODEL = f"{ZOO / 'custom_reader_digits.py'}:Model"
COUNTING_READER_MODEL = f"{ZOO / 'custom_reader_counting.py'}:Model"
G = 32


def write_npz(digits_data: Path, split: str, out: Path, *, limit: int | None = None) -> Path:
    records = [r for f in sorted((digits_data / split).glob("*.rio")) for r in read_records(f)]
    pixels, labels = decode_digits(records)
    pixels, labels = pixels[:limit], labels[:limit]
    np.savez(out, pixels=pixels, labels=labels, ids=np.arange(len(labels)))
    return out


def test_custom_reader_training_and_evaluation(digits_data, tmp_path):
    train = write_npz(digits_data, "train", tmp_path / "train.npz")
    validation = write_npz(digits_data, "validation", tmp_path / "validation.npz")
    job_dir = tmp_path / "job"
    proc = run_flextrain(
        "train", "--model-def", READER_MODEL, "--training-data", str(train), "--validation-data", str(validation),
        "--workers", "2", "--epochs", "6", "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1",
        "--job-dir", str(job_dir), "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["metrics"]["accuracy"] >= 0.9, status["metrics"]


def test_custom_reader_exactly_once_when_a_worker_is_killed(digits_data, tmp_path):
    records = 1408  # the counting model's RECORDS: 11 shards of 4 G
    data = write_npz(digits_data, "train", tmp_path / "count.npz", limit=records)
    counted_exactly_once_through_a_kill(COUNTING_READER_MODEL, str(data), tmp_path / "job", epochs=3, records=records,
                                        G=G)


def test_failing_create_shards_is_refused_at_submission(digits_data, tmp_path):
    train = write_npz(digits_data, "validation", tmp_path / "train.npz")
    job_dir = tmp_path / "job"
    proc = run_flextrain("train", "--model-def", READER_MODEL, "--training-data", str(train), "--job-dir",
                         str(job_dir), "--no-progress", env_extra={"FT_READER_FAIL": "create_shards"}, timeout=120)
    assert proc.returncode != 0
    assert "custom_reader_digits.py: create_shards() of custom_data_reader(data_origin=" in proc.stderr, proc.stderr
    assert "raised ConnectionError: the digits service refused the connection" in proc.stderr, proc.stderr
    assert not (job_dir / "status.json").exists()  # nothing started


def test_failing_read_records_fails_the_job_naming_it(digits_data, tmp_path):
    train = write_npz(digits_data, "validation", tmp_path / "train.npz")
    job_dir = tmp_path / "job"
    # --no-preflight: past submission, so that the workers meet the error
    proc = run_flextrain("train", "--model-def", READER_MODEL, "--training-data", str(train), "--job-dir",
                         str(job_dir), "--no-progress", "--no-preflight", "--workers", "1",
                         env_extra={"FT_READER_FAIL": "read_records"}, timeout=120)
    assert proc.returncode != 0
    status = read_status(job_dir)
    assert status["phase"] == "Failed"
    text = str(status)
    assert "read_records(task) of custom_data_reader(data_origin=" in text, text
    assert "raised ConnectionError: lost the digits service reading digits:" in text, text
