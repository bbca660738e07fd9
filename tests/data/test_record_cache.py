"""The record cache: decoded RecordIO chunks kept across readers and epochs (flextrain/data/chunkcache.py)."""

from __future__ import annotations

import os

import pytest

from flextrain.data import (
    RecordIOReader,
    configure_record_cache,
    open_reader,
    read_shard_range,
    record_cache,
    write_records,
)
from flextrain.data.chunkcache import DEFAULT_RECORD_CACHE_MB, ChunkCache
from flextrain.job import JobSpec, JobSpecError

RECORDS = [bytes([i % 251]) * (40 + i % 7) for i in range(600)]  # variable-size: the starts are kept too
MIB = 1 << 20


@pytest.fixture(autouse=True)
def _default_budget():
    yield
    configure_record_cache(None)  # the other tests of this process get the default back


@pytest.fixture
def multi_chunk(tmp_path):
    path = tmp_path / "multi.rio"
    write_records(path, RECORDS, max_chunk_size=2000)  # ~45 records a chunk, 14 chunks
    return path


def test_a_second_reader_takes_every_chunk_from_the_cache(multi_chunk):
    configure_record_cache(1)
    first = RecordIOReader(multi_chunk)
    assert list(first) == RECORDS
    assert first.chunks_decoded == first.num_chunks > 1
    again = RecordIOReader(multi_chunk)  # the next epoch: another task's reader of the same file
    assert list(again) == RECORDS and again.records(100, 300) == RECORDS[100:300]
    assert list(again.batch(5, 500)) == RECORDS[5:500]
    assert again.chunks_decoded == 0
    assert record_cache().stats().entries == first.num_chunks


def test_a_file_rewritten_between_epochs_is_read_again_not_served_stale(tmp_path):
    path = tmp_path / "data.rio"
    write_records(path, [b"a" * 16] * 50)
    assert read_shard_range(path, 0, 50) == [b"a" * 16] * 50
    st = os.stat(path)
    write_records(path, [b"b" * 16] * 50)  # same size: only the mtime tells the files apart
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert os.path.getsize(path) == st.st_size
    assert read_shard_range(path, 0, 50) == [b"b" * 16] * 50
    assert open_reader(path).chunks_decoded == 1


def test_the_budget_holds_and_the_least_recently_used_chunk_goes_first(multi_chunk):
    reader = RecordIOReader(multi_chunk)
    sizes = [reader._decode_chunk(c).nbytes for c in range(reader.num_chunks)]
    cache = configure_record_cache(0)
    cache.budget = sizes[-1] + sizes[-2]  # the last two chunks fit, not a third (budget in bytes)
    reader = RecordIOReader(multi_chunk)
    reader.records(0, len(RECORDS))
    stats = cache.stats()
    assert stats.bytes <= stats.budget and stats.entries == 2  # only the last two chunks are left
    last = RecordIOReader(multi_chunk)
    last.records(len(RECORDS) - 1, len(RECORDS))
    assert last.chunks_decoded == 0  # the last chunk is cached
    last.records(0, 1)
    assert last.chunks_decoded == 1  # the first was dropped


def test_a_chunk_larger_than_the_budget_is_not_kept():
    cache = ChunkCache(100)
    cache.put(("f", 1, 1, 0, 10), object(), 101)
    cache.put(("f", 1, 1, 10, 20), "kept", 100)
    assert cache.stats().entries == 1 and cache.get(("f", 1, 1, 10, 20)) == "kept"
    assert cache.get(("f", 1, 1, 0, 10)) is None


def test_zero_turns_the_cache_off_but_a_reader_keeps_its_own_chunk(multi_chunk):
    configure_record_cache(0)
    first = RecordIOReader(multi_chunk)
    assert list(first) == RECORDS
    again = RecordIOReader(multi_chunk)
    assert list(again) == RECORDS
    assert again.chunks_decoded == again.num_chunks  # every chunk decoded again
    assert record_cache().stats().entries == 0
    for start in range(0, 40, 8):  # a task's steps within one chunk: decoded once, as before the cache
        again.records(start, start + 8)
    assert again.chunks_decoded == again.num_chunks + 1


def test_a_smaller_budget_drops_what_no_longer_fits(multi_chunk):
    configure_record_cache(1)
    list(RecordIOReader(multi_chunk))
    assert record_cache().stats().entries > 1
    configure_record_cache(0)
    assert record_cache().stats()[:3] == (0, 0, 0)


def test_the_cache_is_off_unless_a_budget_is_set():
    assert DEFAULT_RECORD_CACHE_MB == 0
    assert configure_record_cache(None).budget == 0
    assert configure_record_cache(64).budget == 64 * MIB


@pytest.mark.parametrize("bad", [-1, 1.5, "64", True])
def test_bad_budgets_are_refused_with_the_setting_named(bad):
    with pytest.raises(ValueError, match="record_cache_mb"):
        configure_record_cache(bad)
    with pytest.raises(JobSpecError, match="--record-cache-mb"):
        _spec(record_cache_mb=bad).validate()


def test_the_setting_travels_in_the_jobspec():
    spec = _spec(record_cache_mb=64).validate()
    assert JobSpec.from_json(spec.to_json()).data.record_cache_mb == 64
    assert _spec().validate().data.record_cache_mb is None


def _spec(**settings) -> JobSpec:
    return JobSpec.of(name="j", model_def="m.py:M", job_dir="/tmp/j", training_data="/d", **settings)
