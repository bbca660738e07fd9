"""The hand-rolled hot-path codec writes and reads exactly what protobuf does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flextrain.proto import flextrain_pb2 as fpb
from flextrain.proto import ps_pb2 as pb
from flextrain.protocol import wire
from flextrain.protocol.codec import RowBlock, concat_blocks, decode_sparse_block, sparse_chunks
from flextrain.protocol.shard import row_owners


@pytest.mark.parametrize("n", [1, 127, 128, 300, 70_000])
def test_bytes_field_messages_match_protobuf(n):
    payload = (bytes(range(256)) * (n // 256 + 1))[:n]
    (push,) = wire.gather_chunks([(0, memoryview(payload))], n, n, wire.PUSH_DENSE_TAG)
    assert push == pb.PushChunk(dense=payload).SerializeToString()
    (pull,) = wire.gather_chunks([(0, memoryview(payload))], n, n, wire.PULL_DATA_TAG)
    assert pull == pb.PullDenseChunk(data=payload).SerializeToString()


@pytest.mark.parametrize("value", [1, 127, 128, 2**21, 2**35, 2**63 - 1])
def test_varints_match_protobuf(value):
    assert wire.varint(value) == pb.PushHeader(seq=value).SerializeToString()[1:]


def test_encoder_matches_protobuf_for_tensor_and_nested_messages():
    data = np.arange(12, dtype=np.float32).tobytes()
    tensor = wire.encode_tensor("float32", [3, 4], memoryview(data))
    assert bytes(tensor) == fpb.Tensor(dtype="float32", shape=[3, 4], data=data).SerializeToString()
    chunk = wire.Encoder().message_field(1, tensor).varint_field(2, 42)
    expected = pb.PullEmbeddingChunk(rows=fpb.Tensor(dtype="float32", shape=[3, 4], data=data), version=42)
    assert bytes(chunk) == expected.SerializeToString()


def test_reader_parses_protobuf_output_in_place():
    msg = pb.PullEmbeddingChunk(rows=fpb.Tensor(dtype="bfloat16", shape=[2, 3], data=b"x" * 12), version=-5)
    found = {f: v for f, _, v in wire.fields(msg.SerializeToString())}
    assert wire._signed(found[2]) == -5
    assert wire.decode_tensor(found[1])[:2] == ("bfloat16", [2, 3])
    assert bytes(wire.decode_tensor(found[1])[2]) == b"x" * 12
    with pytest.raises(ValueError):
        list(wire.fields(b"\x0a\x05ab"))  # length beyond the message


def test_sparse_chunks_decode_back_and_parse_with_protobuf():
    ids = np.array([9, 3, 9, 2**40, 3], dtype=np.int64)
    values = torch.arange(15, dtype=torch.float32).view(5, 3)
    per_ps = sparse_chunks("t", ids, values, 2, chunk_bytes=12)  # one row per block
    merged = {}
    for i, messages in enumerate(per_ps):
        for raw in messages:
            block = pb.PushChunk.FromString(raw).sparse  # plain protobuf reads it
            assert block.table == "t" and block.ids.dtype == "int64"
            (field, _, value), = list(wire.fields(raw))
            rb = decode_sparse_block(value)
            assert rb.table == "t" and row_owners(rb.ids, 2).tolist() == [i] * len(rb.ids)
            ids_i, rows_i = concat_blocks([rb], torch.float32)
            merged.update(zip(ids_i.tolist(), rows_i))
    assert sorted(merged) == [3, 9, 2**40]
    torch.testing.assert_close(merged[9], values[0] + values[2])  # duplicates summed before sending
    torch.testing.assert_close(merged[3], values[1] + values[4])


def test_concat_blocks_converts_dtypes_and_rejects_mismatches():
    a = RowBlock.of("t", [1, 2], torch.ones(2, 3, dtype=torch.float64))
    b = RowBlock.of("t", [5], torch.full((1, 3), 2.0))
    ids, values = concat_blocks([a, b], torch.float32)
    assert ids.tolist() == [1, 2, 5] and values.dtype == torch.float32 and values[2, 0] == 2
    with pytest.raises(ValueError, match="different widths"):
        concat_blocks([a, RowBlock.of("t", [7], torch.ones(1, 4))], torch.float32)
    bad = pb.SparseBlock(table="t", ids=fpb.Tensor(dtype="int64", shape=[1], data=bytes(8)),
                         values=fpb.Tensor(dtype="float32", shape=[2, 3], data=bytes(24))).SerializeToString()
    with pytest.raises(ValueError, match="'t': gradient rows must be"):
        decode_sparse_block(bad)


@pytest.mark.parametrize("chunk", [1, 5, 7, 64, 1000])
def test_gather_and_scatter_round_trip_with_padding(chunk):
    # Segments with gaps (padding between dtype groups, absent tensors) read back as zeros.
    rng = np.random.default_rng(chunk)
    segs = [(0, rng.bytes(10)), (16, rng.bytes(7)), (23, rng.bytes(1)), (64, rng.bytes(33))]
    total = 100
    stream = b"".join(bytes(wire.fields(m).__next__()[2]) for m in
                      wire.gather_chunks([(o, memoryview(d)) for o, d in segs], total, chunk, wire.PULL_DATA_TAG))
    expected = bytearray(total)
    for o, d in segs:
        expected[o: o + len(d)] = d
    assert stream == bytes(expected)
    outs = [(o, memoryview(bytearray(len(d)))) for o, d in segs]
    sink = wire.Scatter(outs, total)
    for a in range(0, total, chunk):
        sink.write(stream[a: a + chunk])
    assert sink.complete and [bytes(v) for _, v in outs] == [d for _, d in segs]
    with pytest.raises(ValueError, match="more than"):
        sink.write(b"x")
