"""ChunkRecords cuts fixed-size records out of a decoded chunk in blocks (struct): every slice a
worker asks for must equal record-by-record slicing, as ``bytes``, from bytes or memoryview streams."""

import struct

import pytest

from flextrain.data.chunkrecords import ChunkRecords


def _chunk(length: int, n: int) -> tuple[bytes, list[bytes]]:
    records = [bytes([i % 251]) * length for i in range(n)]
    return b"".join(struct.pack("<I", length) + r for r in records), records


@pytest.mark.parametrize("length", [0, 3, 1024])
@pytest.mark.parametrize("view", [False, True], ids=["bytes", "memoryview"])
@pytest.mark.parametrize("span", [(0, 700), (5, 600), (255, 513), (10, 10), (699, 700), (-3, None)])
def test_fixed_stride_slices_match_record_by_record(length, view, span):
    stream, records = _chunk(length, 700)
    chunk = ChunkRecords(memoryview(stream) if view else stream, 700, stride=length + 4)
    got = chunk[span[0]:span[1]]
    assert got == records[span[0]:span[1]]
    assert all(type(r) is bytes for r in got)
    assert [chunk[i] for i in (0, 256, 699)] == [records[0], records[256], records[699]]
