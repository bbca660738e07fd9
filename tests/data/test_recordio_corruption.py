"""Damaged RecordIO files: errors must name the file and the chunk's offset."""

from __future__ import annotations

import os
import pickle
import struct

import pytest
from rio_refdata import FILES, chunk_bounds, fix_crc, patch_bytes, read_header, snappy_frames

from flextrain.data.errors import CorruptRecordIOError, DataError
from flextrain.data.recordio import Compressor, RecordIOReader, write_records

SNAPPY = "snappy_multi.rio"
CHUNKS = FILES[SNAPPY]["chunks"]
BOUNDS = [0, *chunk_bounds(FILES[SNAPPY])]  # first record index of each chunk


def _assert_names(err: CorruptRecordIOError, path, offset: int) -> None:
    assert err.path == os.fspath(path) and err.offset == offset
    assert os.fspath(path) in str(err)
    assert f"byte offset {offset}:" in str(err)
    assert isinstance(err, DataError) and isinstance(err, ValueError)


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


def test_payload_byte_flip_is_a_crc_mismatch(copy_reference):
    path = copy_reference(SNAPPY)
    bad = CHUNKS[3]["offset"]
    _flip(path, bad + 20 + 50)
    reader = RecordIOReader(path)  # indexing does not read payloads
    assert len(list(reader.read(BOUNDS[2], BOUNDS[3]))) == BOUNDS[3] - BOUNDS[2]  # chunk 2 still fine
    with pytest.raises(CorruptRecordIOError, match="CRC") as info:
        list(reader.read(BOUNDS[3] + 1, BOUNDS[3] + 2))
    _assert_names(info.value, path, bad)
    assert bad == 14490  # pin the number from MANIFEST.json


def test_bad_magic_in_second_chunk(copy_reference):
    path = copy_reference(SNAPPY)
    bad = CHUNKS[1]["offset"]
    patch_bytes(path, bad, b"\x00\x00\x00\x00")
    with pytest.raises(CorruptRecordIOError, match="bad magic") as info:
        RecordIOReader(path)
    _assert_names(info.value, path, bad)
    assert bad == 4830


def test_truncated_mid_chunk(copy_reference):
    path = copy_reference(SNAPPY)
    bad = CHUNKS[5]["offset"]
    os.truncate(path, bad + 20 + 100)
    with pytest.raises(CorruptRecordIOError, match="past end of file") as info:
        RecordIOReader(path)
    _assert_names(info.value, path, bad)
    assert bad == 24150


def test_truncated_mid_header(copy_reference):
    path = copy_reference(SNAPPY)
    bad = CHUNKS[24]["offset"]
    os.truncate(path, bad + 7)
    with pytest.raises(CorruptRecordIOError, match="truncated chunk header") as info:
        RecordIOReader(path)
    _assert_names(info.value, path, bad)


def test_unknown_compressor(copy_reference):
    path = copy_reference(SNAPPY)
    bad = CHUNKS[2]["offset"]
    patch_bytes(path, bad + 8, struct.pack("<I", 9))
    with pytest.raises(CorruptRecordIOError, match="unknown compressor id 9") as info:
        RecordIOReader(path)
    _assert_names(info.value, path, bad)


@pytest.mark.parametrize("delta,match", [(+1, "header says"), (-1, "trailing bytes")])
def test_wrong_record_count_in_header(copy_reference, delta, match):
    path = copy_reference(SNAPPY)
    bad = CHUNKS[4]["offset"]
    n = read_header(path, bad)[4]
    patch_bytes(path, bad + 16, struct.pack("<I", n + delta))  # the CRC does not cover the header
    reader = RecordIOReader(path)
    assert reader.num_records == 1000 + delta
    with pytest.raises(CorruptRecordIOError, match=match) as info:
        list(reader)
    _assert_names(info.value, path, bad)


def test_record_length_overrun(tmp_path):
    path = tmp_path / "none.rio"
    write_records(path, [b"abc", b"defg"] * 5, compressor=Compressor.NONE, max_chunk_size=14)
    reader = RecordIOReader(path)
    second = reader.chunks[1].offset
    patch_bytes(path, second + 20 + 4 + 3, struct.pack("<I", 1_000_000))  # 2nd record's length prefix
    fix_crc(path, second)
    with pytest.raises(CorruptRecordIOError, match="declares 1000000 bytes") as info:
        list(RecordIOReader(path))
    _assert_names(info.value, path, second)


def test_snappy_frame_crc_is_verified(copy_reference):
    """cramjam must check each frame's masked CRC-32C (the chunk CRC is made
    to match, so only the frame CRC can catch this)."""
    path = copy_reference(SNAPPY)
    bad = CHUNKS[6]["offset"]
    with open(path, "rb") as f:
        f.seek(bad + 20)
        payload = f.read(CHUNKS[6]["compressed_size"])
    pos, kind, _ = snappy_frames(payload)[2]
    assert kind == 0x01  # uncompressed frame: flipping data leaves it decodable
    _flip(path, bad + 20 + pos + 8)  # first data byte of the frame
    fix_crc(path, bad)
    with pytest.raises(CorruptRecordIOError, match="cannot decode SNAPPY payload.*checksum") as info:
        list(RecordIOReader(path).read(BOUNDS[6], BOUNDS[6] + 1))
    _assert_names(info.value, path, bad)


@pytest.mark.parametrize("compressor", [Compressor.SNAPPY, Compressor.GZIP])
def test_garbage_compressed_payload(tmp_path, compressor):
    path = tmp_path / "g.rio"
    write_records(path, [b"hello world"] * 50, compressor=compressor)
    size = read_header(path, 0)[3]
    patch_bytes(path, 20, b"\x42" * min(size, 16))  # wreck the stream header
    fix_crc(path, 0)
    with pytest.raises(CorruptRecordIOError, match=f"cannot decode {compressor.name}") as info:
        list(RecordIOReader(path))
    _assert_names(info.value, path, 0)


def test_file_shrunk_after_indexing(copy_reference):
    path = copy_reference(SNAPPY)
    reader = RecordIOReader(path)
    os.truncate(path, CHUNKS[10]["offset"] + 30)
    with pytest.raises(CorruptRecordIOError, match="shorter") as info:
        list(reader.read(BOUNDS[10], BOUNDS[10] + 1))
    _assert_names(info.value, path, CHUNKS[10]["offset"])


def test_error_pickles():
    err = CorruptRecordIOError("/data/x.rio", 123, "bad magic")
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.path, clone.offset, str(clone)) == (err.path, err.offset, str(err))
