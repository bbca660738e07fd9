"""Hand-built hostile and malformed PS messages, sent through generic stubs (the PS and e2e tests share them)."""

from __future__ import annotations

import grpc
import torch

from flextrain.proto import flextrain_pb2 as fpb
from flextrain.proto import ps_pb2 as pb

SERVICE = "/flextrain.ps.v1.ParameterServer/"
DIM = 4


class Raw:
    """Generic calls on a channel with no client-side size limit: what the server gets is what we build."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                               ("grpc.max_receive_message_length", -1)])

    def push(self, *chunks) -> pb.PushResponse:
        call = self.channel.stream_unary(SERVICE + "PushGradients", response_deserializer=pb.PushResponse.FromString)
        return call(iter([c if isinstance(c, bytes) else c.SerializeToString() for c in chunks]), timeout=20)

    def init_dense(self, *chunks) -> pb.InitDenseResponse:
        call = self.channel.stream_unary(SERVICE + "InitDense", request_serializer=pb.InitDenseChunk.SerializeToString,
                                         response_deserializer=pb.InitDenseResponse.FromString)
        return call(iter(chunks), timeout=20)

    def unary(self, method: str, request, response_cls):
        call = self.channel.unary_unary(SERVICE + method, request_serializer=lambda r: r if isinstance(r, bytes)
                                        else r.SerializeToString(), response_deserializer=response_cls.FromString)
        return call(request, timeout=20)

    def stream(self, method: str, request, response_cls) -> list:
        call = self.channel.unary_stream(SERVICE + method, request_serializer=lambda r: r if isinstance(r, bytes)
                                         else r.SerializeToString(), response_deserializer=response_cls.FromString)
        return list(call(request, timeout=20))


def tensor(dtype: str, shape, data: bytes) -> fpb.Tensor:
    return fpb.Tensor(dtype=dtype, shape=list(shape), data=data)


def ids(*values: int) -> fpb.Tensor:
    return tensor("int64", [len(values)], torch.tensor(values, dtype=torch.int64).numpy().tobytes())


def rows(n: int, dim: int = DIM, dtype: str = "float32") -> fpb.Tensor:
    return tensor(dtype, [n, dim], bytes(n * dim * getattr(torch, dtype).itemsize))


def sparse(table: str, ids_t: fpb.Tensor, values: fpb.Tensor) -> pb.PushChunk:
    return pb.PushChunk(sparse=pb.SparseBlock(table=table, ids=ids_t, values=values))


def header(step: int, *, seq: int = 1, **fields) -> pb.PushChunk:
    """A push header for minibatch [0, 4) of task ``step`` from client ``hostile-<step>``."""
    return pb.PushChunk(header=pb.PushHeader(client_id=f"hostile-{step}", seq=seq, base_version=0,
                                             step=pb.TaskStep(task_id=step, start=0, end=4), **fields))


def layout_id_of(raw: Raw) -> int:
    """The PS's dense layout id (0: no dense parameters there)."""
    return raw.unary("Describe", pb.DescribeRequest(), pb.DescribeResponse).layout.layout_id


BAD_TASKS = range(1000, 1100)  # the task ids the bad pushes name


def bad_pushes(lid: int):
    """(case, chunks, what the refusal must say); each names its own task in BAD_TASKS."""
    t = iter(BAD_TASKS)
    return [
        ("truncated first message", [b"\xff"], "varint"),
        ("undecodable header", [b"\x0a\x03\xff\xff\xff"], ""),
        ("no header", [pb.PushChunk(dense=bytes(16))], "must start with a header"),
        ("dense bytes not the layout's", [header(next(t), layout_id=lid, dense_bytes=15), pb.PushChunk(dense=bytes(15))],
         "announces 15 dense bytes"),
        ("dense bytes negative", [header(next(t), layout_id=lid, dense_bytes=-16)], "announces -16 dense bytes"),
        ("fewer dense bytes than announced", [header(next(t), layout_id=lid, dense_bytes=16),
                                              pb.PushChunk(dense=bytes(8))], "ended after 8 of 16"),
        ("more dense bytes than announced", [header(next(t), layout_id=lid, dense_bytes=16),
                                             pb.PushChunk(dense=bytes(24))], "more than the 16 bytes"),
        ("wrong layout id", [header(next(t), layout_id=lid ^ 1, dense_bytes=16), pb.PushChunk(dense=bytes(16))],
         "do not match the layout"),
        ("unknown absent parameter", [header(next(t), layout_id=lid, dense_bytes=16, absent=["nope"]),
                                      pb.PushChunk(dense=bytes(16))], "unknown dense parameter"),
        ("unknown table", [header(next(t), sparse_blocks=1), sparse("nope", ids(1), rows(1))], "unknown embedding table 'nope'"),
        ("rows of an integer dtype", [header(next(t), sparse_blocks=1), sparse("emb", ids(1), rows(1, dtype="int32"))],
         "gradient rows must be a float"),
        ("unknown dtype name", [header(next(t), sparse_blocks=1), sparse("emb", ids(1), tensor("float8", [1, DIM], bytes(DIM)))],
         "got dtype 'float8'"),
        ("more rows than ids", [header(next(t), sparse_blocks=1), sparse("emb", ids(1), rows(2))], "float [1, dim]"),
        ("row bytes short of the shape", [header(next(t), sparse_blocks=1), sparse("emb", ids(1), tensor("float32", [1, DIM], bytes(15)))],
         "with 15 bytes"),
        ("row bytes not a multiple of the dtype",
         [header(next(t), sparse_blocks=1), sparse("emb", ids(1, 2), tensor("float32", [2, DIM], bytes(2 * DIM * 4 + 3)))],
         "with 35 bytes"),
        ("rows wider than the table", [header(next(t), sparse_blocks=1), sparse("emb", ids(1), rows(1, dim=DIM + 1))], "width 5"),
        ("rows of a huge shape", [header(next(t), sparse_blocks=1), sparse("emb", ids(1, 2), tensor("float32", [2, 1 << 61], b""))],
         "gradient rows"),
        ("shape product overflowing int64",
         [header(next(t), sparse_blocks=1), sparse("emb", ids(1, 2), tensor("float32", [2, (1 << 63) - 1], bytes(8)))], "gradient rows"),
        ("negative dimension", [header(next(t), sparse_blocks=1), sparse("emb", ids(1), tensor("float32", [1, -4], b""))],
         "gradient rows"),
        ("ids of a float dtype", [header(next(t), sparse_blocks=1), sparse("emb", tensor("float64", [1], bytes(8)), rows(1))],
         "ids must be an int64 vector"),
        ("ids bytes not a multiple of 8", [header(next(t), sparse_blocks=1), sparse("emb", tensor("int64", [2], bytes(15)), rows(2))],
         "ids must be an int64 vector"),
        ("negative id count", [header(next(t), sparse_blocks=1), sparse("emb", tensor("int64", [-1], b""), rows(0))],
         "ids must be an int64 vector"),
        ("negative id", [header(next(t), sparse_blocks=1), sparse("emb", ids(-5), rows(1))], "-5"),
        ("step not a range", [pb.PushChunk(header=pb.PushHeader(client_id="hostile", seq=1, sparse_blocks=1, step=pb.TaskStep(
            task_id=next(t), start=4, end=4))), sparse("emb", ids(1), rows(1))], "not a range"),
        ("fewer sparse blocks than announced", [header(next(t), sparse_blocks=2), sparse("emb", ids(1), rows(1))],
         "announces 2 sparse blocks and sent 1"),
        ("more sparse blocks than announced", [header(next(t)), sparse("emb", ids(1), rows(1))],
         "announces 0 sparse blocks and sent 1"),
    ]


