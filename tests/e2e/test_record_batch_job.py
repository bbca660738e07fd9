"""A module with ``record_batch = True`` (feed gets a RecordBatch viewing the decoded RecordIO
chunk) trains a job in which a worker is SIGKILLed, and every record is applied exactly once per
epoch (the counting model's own per-record counts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ft_helpers import counted_exactly_once_through_a_kill, counting_data

pytestmark = pytest.mark.e2e

BATCH_MODEL = f"{Path(__file__).resolve().parent / 'zoo' / 'counting_batch.py'}:Model"


def test_record_batches_are_applied_exactly_once_through_a_kill(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")  # 64 KiB chunks: some steps span two chunks
    counted_exactly_once_through_a_kill(BATCH_MODEL, str(data), tmp_path / "job", epochs=3)
