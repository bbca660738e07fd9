"""Writing RecordIO files and reading them back."""

from __future__ import annotations

import pytest
from rio_refdata import (
    EMPTY_RECORDS,
    FILES,
    MULTI_RECORDS,
    NONE_SMALL_RECORDS,
    TESTDATA,
    read_header,
    records_digest,
    snappy_frames,
)

from flextrain.data.recordio import (
    DEFAULT_MAX_CHUNK_SIZE,
    Compressor,
    RecordIOReader,
    RecordIOWriter,
    read_records,
    write_records,
)

ALL_COMPRESSORS = list(Compressor)
BIG = bytes((i * 7919) % 251 for i in range(200_000))  # > 3 snappy frames, compressible-ish


def _payload(path, chunk) -> bytes:
    with open(path, "rb") as f:
        f.seek(chunk.offset + 20)
        return f.read(chunk.compressed_size)


def test_manifest_records_match_helpers():
    assert records_digest(NONE_SMALL_RECORDS) == FILES["none_small.rio"]["records_digest_sha256"]
    assert records_digest(MULTI_RECORDS) == FILES["snappy_multi.rio"]["records_digest_sha256"]
    assert records_digest(EMPTY_RECORDS) == FILES["empty_records.rio"]["records_digest_sha256"]


def test_none_small_is_byte_identical_to_go(tmp_path):
    out = tmp_path / "none_small.rio"
    write_records(out, NONE_SMALL_RECORDS, compressor=Compressor.NONE)
    assert out.read_bytes() == (TESTDATA / "none_small.rio").read_bytes()


@pytest.mark.parametrize("name", ["snappy_multi.rio", "gzip_multi.rio"])
def test_chunking_matches_go(tmp_path, name):
    """Same records and max_chunk_size as the Go writer -> same chunk split."""
    entry = FILES[name]
    out = tmp_path / name
    write_records(out, MULTI_RECORDS, compressor=entry["compressor_id"], max_chunk_size=4096)
    reader = RecordIOReader(out)
    assert [c.num_records for c in reader.chunks] == [c["num_records"] for c in entry["chunks"]]
    assert list(reader) == MULTI_RECORDS


@pytest.mark.parametrize("compressor", ALL_COMPRESSORS)
def test_roundtrip(tmp_path, compressor):
    records = [b"", b"a", BIG, b"", b"x" * 3000, *MULTI_RECORDS[:200], b"", BIG[::-1], b"tail"]
    out = tmp_path / f"rt-{compressor.name}.rio"
    with RecordIOWriter(out, compressor=compressor, max_chunk_size=8192) as writer:
        for rec in records:
            writer.write(rec)
    reader = RecordIOReader(out)
    assert reader.num_records == len(records)
    assert reader.num_chunks > 3
    assert {c.compressor for c in reader.chunks} == {compressor}
    assert list(reader) == records
    for start, end in [(0, 3), (2, 3), (4, 50), (len(records) - 2, len(records))]:
        assert list(RecordIOReader(out).read(start, end)) == records[start:end]


@pytest.mark.parametrize("compressor", ALL_COMPRESSORS)
def test_fixed_size_records_are_sliced_out_exactly(tmp_path, compressor):
    """Equal-length records take the stride fast path: every range, within and across chunks."""
    records = [i.to_bytes(4, "little") * 25 for i in range(300)]
    out = tmp_path / f"fixed-{compressor.name}.rio"
    with RecordIOWriter(out, compressor=compressor, max_chunk_size=100 * 64) as writer:
        for rec in records:
            writer.write(rec)
    reader = RecordIOReader(out)
    assert reader.num_chunks > 2
    for start, end in [(0, 0), (0, 1), (5, 70), (63, 65), (60, 200), (299, 300), (0, 300), (130, 130)]:
        got = reader.records(start, end)
        assert got == records[start:end] and all(type(r) is bytes for r in got), (start, end)
        assert list(reader.read(start, end)) == records[start:end]


def test_big_record_spans_several_snappy_frames(tmp_path):
    out = tmp_path / "big.rio"
    write_records(out, [BIG], compressor=Compressor.SNAPPY)
    reader = RecordIOReader(out)
    frames = snappy_frames(_payload(out, reader.chunks[0]))
    assert frames[0][1:] == (0xFF, 6)  # stream identifier
    assert len([f for f in frames if f[1] in (0x00, 0x01)]) >= 4  # 200 000 B / 64 KiB
    assert read_records(out) == [BIG]


def test_gzip_member_header_is_gos(tmp_path):
    out = tmp_path / "gz.rio"
    write_records(out, MULTI_RECORDS[:10], compressor=Compressor.GZIP)
    go_first = RecordIOReader(TESTDATA / "gzip_multi.rio").chunks[0]
    ours = _payload(out, RecordIOReader(out).chunks[0])
    assert ours[:10] == _payload(TESTDATA / "gzip_multi.rio", go_first)[:10] == bytes.fromhex("1f8b08000000000000ff")


def test_chunking_rule_exact(tmp_path):
    # max 10: [4,6] (sum 10 fits), [1] (+10 > 10), [10,0], [11] (oversize, own chunk), [3]
    lengths = [4, 6, 1, 10, 0, 11, 3]
    out = tmp_path / "rule.rio"
    write_records(out, [b"z" * n for n in lengths], compressor=Compressor.NONE, max_chunk_size=10)
    reader = RecordIOReader(out)
    assert [c.num_records for c in reader.chunks] == [2, 1, 2, 1, 1]
    assert [len(r) for r in reader] == lengths


@pytest.mark.parametrize("size", [0, -1])
def test_non_positive_max_chunk_size_means_default(tmp_path, size):
    out = tmp_path / "d.rio"
    write_records(out, [b"q" * 1000] * 100, max_chunk_size=size)
    assert RecordIOReader(out).num_chunks == 1
    assert DEFAULT_MAX_CHUNK_SIZE == 32 * 1024 * 1024


def test_no_records_gives_empty_file(tmp_path):
    out = tmp_path / "empty.rio"
    assert write_records(out, []) == 0
    assert out.read_bytes() == b""
    assert read_records(out) == []


def test_snappy_default_and_header_fields(tmp_path):
    out = tmp_path / "s.rio"
    write_records(out, EMPTY_RECORDS)
    magic, _, comp, size, n = read_header(out, 0)
    assert (magic, comp, n, out.stat().st_size) == (0x01020304, 1, 20, 20 + size)
    assert read_records(out) == EMPTY_RECORDS


def test_accepts_bytes_like_and_copies(tmp_path):
    out = tmp_path / "b.rio"
    buf = bytearray(b"abc")
    with RecordIOWriter(out, compressor=Compressor.NONE) as writer:
        writer.write(buf)
        buf[:] = b"XYZ"  # caller reuses its buffer
        writer.write(memoryview(b"def"))
    assert read_records(out) == [b"abc", b"def"]


def test_writer_misuse(tmp_path):
    with pytest.raises(ValueError):
        RecordIOWriter(tmp_path / "x.rio", compressor=7)
    writer = RecordIOWriter(tmp_path / "y.rio")
    with pytest.raises(TypeError):
        writer.write("text")
    writer.write(b"ok")
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"late")
    assert read_records(tmp_path / "y.rio") == [b"ok"]


def test_context_manager_keeps_written_records_on_error(tmp_path):
    out = tmp_path / "e.rio"
    with pytest.raises(RuntimeError):
        with RecordIOWriter(out) as writer:
            writer.write(b"one")
            raise RuntimeError("boom")
    assert read_records(out) == [b"one"]
