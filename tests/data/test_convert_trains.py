"""Converted data trains: the digits as CSV -> `flextrain data convert` -> a real local job reading the shards."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from ft_helpers import read_status, run_flextrain

pytestmark = pytest.mark.e2e

MODEL = f"{Path(__file__).resolve().parents[1] / 'e2e' / 'zoo' / 'converted_digits.py'}:Model"


def write_digits_csv(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*(f"p{i}" for i in range(64)), "label"])
        w.writerows([*map(int, image), int(label)] for image, label in zip(images, labels))


def test_digits_converted_from_csv_train_above_90_percent(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    held_out, train = order[:360], order[360:]
    for split, idx in (("train", train), ("validation", held_out)):
        write_digits_csv(tmp_path / f"{split}.csv", digits.data[idx], digits.target[idx])
        proc = run_flextrain("data", "convert", str(tmp_path / f"{split}.csv"), "--out", str(tmp_path / split),
                             "--shard-size", "500", "--workers", "2", timeout=60)
        assert proc.returncode == 0, proc.stderr
    job_dir = tmp_path / "job"
    proc = run_flextrain("train", "--model-def", MODEL, "--training-data", str(tmp_path / "train"),
                         "--validation-data", str(tmp_path / "validation"), "--workers", "1", "--epochs", "4",
                         "--global-batch-size", "64", "--lr", "0.1", "--job-dir", str(job_dir), timeout=120)
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == 4 * len(train)
    assert status["metrics"]["accuracy"] >= 0.9
