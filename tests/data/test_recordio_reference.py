"""Reading the reference files written by the Go library (MANIFEST.json)."""

from __future__ import annotations

import pytest
from rio_refdata import FILES, TESTDATA, chunk_bounds, chunks_overlapping, records_digest, sha256

from flextrain.data import clear_reader_cache, recordio
from flextrain.data.recordio import Compressor, RecordIOReader

NAMES = sorted(FILES)


def _ranges(entry) -> list[tuple[int, int]]:
    """[0,3), [N/2, N/2+3), [N-1, N) and both sides of every chunk boundary."""
    n = entry["num_records"]
    if n == 0:
        return [(0, 0)]
    ranges = [(0, min(3, n)), (n // 2, min(n // 2 + 3, n)), (n - 1, n)]
    for b in chunk_bounds(entry):
        ranges += [(b - 1, b + 1), (b, b + 1), (b - 1, b)]
    return ranges


@pytest.mark.parametrize("name", NAMES)
def test_index_matches_manifest(name):
    entry = FILES[name]
    reader = RecordIOReader(TESTDATA / name)
    assert reader.num_records == len(reader) == entry["num_records"]
    assert reader.num_chunks == entry["num_chunks"]
    table = [
        (c.offset, c.compressed_size, c.num_records, c.checksum, int(c.compressor)) for c in reader.chunks
    ]
    expected = [
        (c["offset"], c["compressed_size"], c["num_records"], c["checksum_crc32_ieee"], entry["compressor_id"])
        for c in entry["chunks"]
    ]
    assert table == expected
    assert reader.chunks_decoded == 0  # indexing reads headers only


@pytest.mark.parametrize("name", NAMES)
def test_all_records_match(name):
    entry = FILES[name]
    reader = RecordIOReader(TESTDATA / name)
    records = list(reader)
    assert [[len(r), sha256(r)] for r in records] == entry["records"]
    assert records_digest(records) == entry["records_digest_sha256"]
    assert reader.chunks_decoded == entry["num_chunks"]  # a full pass decodes each chunk once
    assert recordio.read_records(TESTDATA / name) == records


@pytest.mark.parametrize("name", NAMES)
def test_ranged_reads(name):
    entry = FILES[name]
    reader = RecordIOReader(TESTDATA / name)
    for start, end in _ranges(entry):
        got = [[len(r), sha256(r)] for r in reader.read(start, end)]
        assert got == entry["records"][start:end], (start, end)
        listed = reader.records(start, end)  # the list a worker gets per step
        assert [[len(r), sha256(r)] for r in listed] == entry["records"][start:end], (start, end)
        assert all(type(r) is bytes for r in listed)


@pytest.mark.parametrize("name", NAMES)
def test_ranged_read_decodes_only_needed_chunks(name):
    entry = FILES[name]
    for start, end in _ranges(entry):
        clear_reader_cache()  # and the decoded chunks another reader of the file left in the record cache
        reader = RecordIOReader(TESTDATA / name)  # fresh: empty chunk cache
        list(reader.read(start, end))
        assert reader.chunks_decoded == chunks_overlapping(entry, start, end), (start, end)


def test_decoding_spy_agrees_with_counter(monkeypatch):
    """chunks_decoded must reflect real decompression work."""
    calls = []
    real = recordio._decompress
    monkeypatch.setattr(recordio, "_decompress", lambda p, c: calls.append(c) or real(p, c))
    entry = FILES["snappy_multi.rio"]
    first = chunk_bounds(entry)[9]  # first record of chunk 10
    reader = RecordIOReader(TESTDATA / "snappy_multi.rio")
    list(reader.read(first + 1, first + 5))
    assert calls == [Compressor.SNAPPY] and reader.chunks_decoded == 1


def test_consecutive_reads_in_one_chunk_reuse_the_cache():
    entry = FILES["gzip_multi.rio"]
    bounds = chunk_bounds(entry)
    reader = RecordIOReader(TESTDATA / "gzip_multi.rio")
    lo, hi = bounds[3], bounds[4]  # chunk 4
    for i in range(lo, hi):
        assert sha256(next(reader.read(i, i + 1))) == entry["records"][i][1]
    assert reader.chunks_decoded == 1
    list(reader.read(hi - 1, hi + 1))  # chunk 4 cached, chunk 5 decoded
    assert reader.chunks_decoded == 2


def test_empty_range_decodes_nothing():
    reader = RecordIOReader(TESTDATA / "snappy_multi.rio")
    assert list(reader.read(500, 500)) == []
    assert list(reader.read(1000, 1000)) == []
    assert reader.chunks_decoded == 0


def test_default_range_is_everything():
    reader = RecordIOReader(TESTDATA / "none_small.rio")
    assert list(reader.read()) == list(reader.read(0, 10)) == list(reader)
    assert list(reader.read(7)) == list(reader)[7:]


@pytest.mark.parametrize("start,end", [(-1, 2), (0, 11), (5, 4), (11, 11)])
def test_out_of_range_is_a_clear_value_error(start, end):
    path = TESTDATA / "none_small.rio"
    reader = RecordIOReader(path)
    with pytest.raises(ValueError, match=r"out of bounds") as info:
        reader.read(start, end)  # raised eagerly, not on first next()
    assert str(path) in str(info.value) and "10 records" in str(info.value)


def test_non_integer_bounds_rejected():
    reader = RecordIOReader(TESTDATA / "none_small.rio")
    with pytest.raises(TypeError):
        reader.read(0.5, 2)


def test_zero_byte_file_has_no_records():
    reader = RecordIOReader(TESTDATA / "zero_records.rio")
    assert (reader.num_records, reader.num_chunks, list(reader)) == (0, 0, [])
    with pytest.raises(ValueError):
        reader.read(0, 1)
