"""RecordBatch: a step's records as a sequence of bytes equal to the list the readers give, and
``array(dtype)`` that views the decoded RecordIO chunk in place (no copy) when it can, joins the
records once when it cannot, and names the problem when the records do not fit the dtype."""

from __future__ import annotations

import numpy as np
import pytest

from flextrain.data import RecordBatch, clear_reader_cache, read_shard_range, records_array, write_records
from flextrain.data.csv import CSVReader

ROW = np.dtype([("x", "<f4", (3,)), ("y", "<i4")])  # 16 bytes


def rows(n: int, start: int = 0) -> np.ndarray:
    out = np.empty(n, ROW)
    out["x"] = np.arange(start * 3, (start + n) * 3, dtype=np.float32).reshape(n, 3)
    out["y"] = np.arange(start, start + n)
    return out


@pytest.fixture
def rio(tmp_path):
    """500 fixed-size records in chunks of ~1 KiB (~50 records each), and 30 of varying sizes."""
    clear_reader_cache()
    fixed = tmp_path / "fixed.rio"
    write_records(fixed, [r.tobytes() for r in rows(500)], max_chunk_size=1024)
    mixed = tmp_path / "mixed.rio"
    write_records(mixed, [bytes([i]) * (i % 7) for i in range(30)])
    return str(fixed), str(mixed)


@pytest.mark.parametrize("span", [(0, 500), (3, 40), (40, 120), (499, 500), (7, 7)])
def test_a_batch_is_the_same_sequence_as_the_list(rio, span):
    for path in rio:
        lo, hi = min(span[0], 30) if path == rio[1] else span[0], min(span[1], 30) if path == rio[1] else span[1]
        listed = read_shard_range(path, lo, hi)
        batch = read_shard_range(path, lo, hi, as_batch=True)
        assert isinstance(batch, RecordBatch) and len(batch) == len(listed)
        assert list(batch) == listed and b"".join(batch) == b"".join(listed)
        assert batch[:] == listed and batch[2:9] == listed[2:9] and batch[::3] == listed[::3]
        if listed:
            assert batch[0] == listed[0] and batch[-1] == listed[-1] and batch[len(listed) // 2] == listed[len(listed) // 2]
            assert all(type(r) is bytes for r in (batch[0], batch[-1]))
        with pytest.raises(IndexError):
            batch[len(listed)]


def test_array_views_the_decoded_chunk_without_copying(rio):
    fixed, _ = rio
    first = read_shard_range(fixed, 3, 40, as_batch=True).array(ROW)  # inside the first chunk
    again = read_shard_range(fixed, 10, 20, as_batch=True).array(ROW)
    assert np.array_equal(first, rows(37, 3)) and np.array_equal(again, rows(10, 10))
    # both view the reader's one decoded chunk: the same memory, not two copies
    assert np.shares_memory(first, again) and first.strides == (ROW.itemsize + 4,)
    assert not first.flags.writeable  # a feed cannot change what the next read sees


def test_array_joins_records_that_span_chunks_or_vary_in_size(rio):
    fixed, mixed = rio
    batch = read_shard_range(fixed, 40, 120, as_batch=True)  # crosses at least one chunk boundary
    assert np.array_equal(batch.array(ROW), rows(80, 40))
    sixes = read_shard_range(mixed, 13, 14, as_batch=True)  # a chunk of varying sizes: one record of 6 bytes
    assert records_array(sixes, np.dtype((np.uint8, 6))).tolist() == [[13] * 6]


def test_records_array_takes_a_plain_list_too(rio):
    listed = read_shard_range(rio[0], 3, 40)
    assert np.array_equal(records_array(listed, ROW), rows(37, 3))


@pytest.mark.parametrize("span", [(0, 30), (6, 7)])
def test_records_that_do_not_fit_the_dtype_are_refused_naming_both_sizes(rio, span):
    fixed, mixed = rio
    for batch in (read_shard_range(fixed, 0, 30, as_batch=True), read_shard_range(mixed, *span, as_batch=True)):
        with pytest.raises(ValueError, match=r"records of \d+ bytes cannot be read as .* \(8 bytes per record"):
            batch.array(np.dtype("<f8"))
    with pytest.raises(ValueError, match="cannot be read as"):
        records_array(read_shard_range(mixed, *span), np.dtype("<f8"))


def test_csv_lines_come_as_a_batch_and_table_rows_as_a_list(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("1,2\n3,4\n5,6\n")
    batch = read_shard_range(str(path), 1, 3, as_batch=True)
    assert isinstance(batch, RecordBatch) and list(batch) == CSVReader(str(path)).records(1, 3)
