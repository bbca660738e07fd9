"""Jobs over Parquet data: the digits set as Parquet files with several small row groups.

(a) a job trains and evaluates a module whose ``feed`` takes row dicts;
(b) with a worker killed mid-job, every record is still applied exactly once
per epoch (the counting model, tests/e2e/zoo/counting_digits.py, reading the
record ids from the rows' ``id`` column).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flextrain.data import decode_digits, make_shards, read_records
from ft_helpers import COUNTING_MODEL, counted_exactly_once_through_a_kill, read_status, run_flextrain

pytestmark = pytest.mark.e2e

PARQUET_MODEL = f"{Path(__file__).resolve().parent / 'zoo' / 'parquet_digits.py'}:Model"
G = 32


def digits(digits_data: Path, split: str):
    records = [r for f in sorted((digits_data / split).glob("*.rio")) for r in read_records(f)]
    return decode_digits(records)  # pixels (n, 64) float32 in [0, 1], labels (n,) int64


def write_parquet(out: Path, pixels, labels, *, files: int, row_group: int, ids: bool = False) -> Path:
    """At most ``files`` Parquet files (named like ElasticDL shards, no extension) of row groups of ``row_group``
    rows."""
    out.mkdir(parents=True, exist_ok=True)
    n = len(labels)
    per_file = -(-n // (files * row_group)) * row_group  # whole row groups but in the last file
    for k, lo in enumerate(range(0, n, per_file)):
        hi = min(lo + per_file, n)
        columns = {"pixels": pa.array(list(pixels[lo:hi]), pa.list_(pa.float32())),
                   "label": pa.array(labels[lo:hi], pa.int64())}
        if ids:
            columns["id"] = pa.array(range(lo, hi), pa.int64())
        pq.write_table(pa.table(columns), out / f"data-{k:05d}", row_group_size=row_group)
    return out


def test_parquet_training_and_evaluation(digits_data, tmp_path):
    train = write_parquet(tmp_path / "train", *digits(digits_data, "train"), files=3, row_group=100)
    validation = write_parquet(tmp_path / "validation", *digits(digits_data, "validation"), files=1, row_group=100)
    shards = make_shards(train)
    assert len({s.source for s in shards}) == 3 and len(shards) > 3 and max(s.size for s in shards) == 100
    job_dir = tmp_path / "job"
    proc = run_flextrain(
        "train", "--model-def", PARQUET_MODEL, "--training-data", str(train), "--validation-data", str(validation),
        "--workers", "2", "--epochs", "6", "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1",
        "--job-dir", str(job_dir), "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["metrics"]["accuracy"] >= 0.9, status["metrics"]


def test_parquet_exactly_once_when_a_worker_is_killed(digits_data, tmp_path):
    pixels, labels = digits(digits_data, "train")
    records = 1408  # the counting model's RECORDS; row groups of 4 G each, so every step is a full G
    data = write_parquet(tmp_path / "data", pixels[:records], labels[:records], files=3, row_group=4 * G, ids=True)
    assert [s.size for s in make_shards(data)] == [4 * G] * 11
    counted_exactly_once_through_a_kill(COUNTING_MODEL, str(data), tmp_path / "job", epochs=3, records=records, G=G)