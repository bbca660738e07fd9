"""Hostile and malformed messages sent to a real PS over loopback gRPC, through generic stubs.

Each bad message must be refused with INVALID_ARGUMENT naming the problem (or
RESOURCE_EXHAUSTED, from gRPC itself, above the message size limit), and leave
the shard as it was: same version, rows, pending pushes, parameters, write-ahead
log, and no minibatch counted for exactly-once. The PS then serves good calls.
"""

from __future__ import annotations

import math
from pathlib import Path

import grpc
import pytest
import torch

from flextrain.proto import ps_pb2 as pb
from flextrain.protocol.limits import MAX_PS_MESSAGE, MAX_TASK_IDS
from hostile_wire import BAD_TASKS, DIM, Raw, bad_pushes, header, ids, layout_id_of, rows, sparse, tensor

INVALID, TOO_BIG = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def ps(tmp_path_factory):
    """One durable PS (write-ahead log on) with dense w[4] float32 and table emb[dim 4]; a client; a raw stub."""
    from flextrain.ps.main import start_ps
    from flextrain.worker.ps_client import PSClient

    directory = tmp_path_factory.mktemp("ps")
    handle = start_ps(host="127.0.0.1", optimizer="sgd", hyper={"lr": 1.0}, mode="async", checkpoint_dir=directory)
    client = PSClient([handle.address], give_up=5.0, deadline=10.0)
    client.init_dense({"w": torch.zeros(4)})
    client.declare_table("emb", DIM)
    client.pull_embedding("emb", [1, 2])
    raw = Raw(handle.address)
    yield handle, client, raw, directory
    raw.channel.close()
    client.close()
    handle.stop(grace=0.2, checkpoint=False)


def shard_state(client, directory: Path) -> tuple:
    """What a refused message must not change: version, rows, pending pushes, parameters, log, progress."""
    info = client.describe()[0]
    _, params = client.pull_dense(None)
    log = sorted((p.name, p.stat().st_size) for p in directory.rglob("*") if p.is_file())
    progress = [client.task_progress(t)[0] for t in BAD_TASKS]
    return (info.version, dict(info.table_rows), info.pending_pushes, params["w"].tolist(), log, progress)


def expect(code: grpc.StatusCode | tuple, says: str, call) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    codes = code if isinstance(code, tuple) else (code,)
    assert err.value.code() in codes, f"{err.value.code()}: {err.value.details()}"
    assert says in (err.value.details() or ""), err.value.details()


def test_bad_pushes_are_refused_and_change_nothing(ps):
    _, client, raw, directory = ps
    before = shard_state(client, directory)
    assert before[-1] == [-1] * len(BAD_TASKS)
    for case, chunks, says in bad_pushes(layout_id_of(raw)):
        try:
            expect(INVALID, says, lambda: raw.push(*chunks))
        except AssertionError as exc:
            raise AssertionError(f"{case}: {exc}") from None
        assert shard_state(client, directory) == before, case
    # Still serving, and the refused pushes counted for nothing: the same minibatch applies once now.
    lid = layout_id_of(raw)
    grad = torch.ones(4).numpy().tobytes()
    good = raw.push(header(BAD_TASKS[0], layout_id=lid, dense_bytes=16), pb.PushChunk(dense=grad))
    assert good.accepted and good.applied and not good.duplicate
    assert client.pull_dense(None)[1]["w"].tolist() == [-1.0] * 4
    again = raw.push(header(BAD_TASKS[0], layout_id=lid, dense_bytes=16, seq=2), pb.PushChunk(dense=grad))
    assert again.duplicate and not again.applied


BAD_INITS = [
    ("no layout first", [pb.InitDenseChunk(data=bytes(8))], "must start with the layout"),
    ("unknown dtype", [pb.InitDenseChunk(layout=pb.DenseLayout(tensors=[pb.TensorSpec(name="v", dtype="int8",
                                                                                      shape=[2])]))], "'int8'"),
    ("negative dimension", [pb.InitDenseChunk(layout=pb.DenseLayout(tensors=[
        pb.TensorSpec(name="v", dtype="float32", shape=[2, -3])]))], "negative dimension"),
    ("shape beyond any memory", [pb.InitDenseChunk(layout=pb.DenseLayout(tensors=[
        pb.TensorSpec(name="v", dtype="float64", shape=[1 << 40, 1 << 40])]))], "machine's memory"),
    ("duplicate names", [pb.InitDenseChunk(layout=pb.DenseLayout(tensors=[
        pb.TensorSpec(name="v", dtype="float32", shape=[1])] * 2))], "listed twice"),
    ("fewer bytes than the layout", [pb.InitDenseChunk(layout=pb.DenseLayout(tensors=[
        pb.TensorSpec(name="v", dtype="float32", shape=[4])]), data=bytes(15))], "ended after 15 of 16"),
    ("more bytes than the layout", [pb.InitDenseChunk(layout=pb.DenseLayout(tensors=[
        pb.TensorSpec(name="v", dtype="float32", shape=[4])]), data=bytes(16)), pb.InitDenseChunk(data=b"x")],
     "more than the 16 bytes"),
    ("a big announcement, no bytes", [pb.InitDenseChunk(layout=pb.DenseLayout(tensors=[
        pb.TensorSpec(name="v", dtype="float32", shape=[1 << 28])]))], "ended after 0 of"),
]


@pytest.mark.parametrize("case,chunks,says", BAD_INITS, ids=[c[0] for c in BAD_INITS])
def test_bad_init_dense_leaves_the_shard_uninitialised(case, chunks, says):
    from flextrain.ps.main import start_ps
    from flextrain.worker.ps_client import PSClient

    handle = start_ps(host="127.0.0.1", optimizer="sgd", wal=False)
    raw, client = Raw(handle.address), PSClient([handle.address], give_up=5.0)
    try:
        expect(INVALID, says, lambda: raw.init_dense(*chunks))
        assert not client.describe()[0].dense_initialized
        client.init_dense({"w": torch.arange(3.0)})
        assert client.pull_dense(None)[1]["w"].tolist() == [0.0, 1.0, 2.0]
    finally:
        raw.channel.close()
        client.close()
        handle.stop(grace=0.2, checkpoint=False)


def test_bad_pulls_tables_and_settings_are_refused(ps):
    _, client, raw, directory = ps
    before = shard_state(client, directory)
    emb = pb.PullEmbeddingChunk
    cases = [
        ("PullEmbedding", pb.PullEmbeddingRequest(table="nope", ids=ids(1)), emb, "unknown embedding table"),
        ("PullEmbedding", pb.PullEmbeddingRequest(table="emb", ids=tensor("int32", [1], bytes(4))), emb, "int64"),
        ("PullEmbedding", pb.PullEmbeddingRequest(table="emb", ids=tensor("int64", [2], bytes(12))), emb, "12 bytes"),
        ("PullEmbedding", pb.PullEmbeddingRequest(table="emb", ids=tensor("int64", [1, 1], bytes(8))), emb, "vector"),
        ("PullEmbedding", pb.PullEmbeddingRequest(table="emb", ids=ids(3, -1)), emb, "-1"),
        ("PullDense", pb.PullDenseRequest(wait_seconds=math.nan), pb.PullDenseChunk, "wait_seconds"),
    ]
    for method, request, response, says in cases:
        expect(INVALID, says, lambda: raw.stream(method, request, response))
        assert shard_state(client, directory) == before, (method, says)
    tables = pb.DeclareTablesResponse
    unary = [
        ("DeclareTables", pb.DeclareTablesRequest(tables=[pb.TableSpec(name="t", dim=0)]), tables, "dim must be >= 1"),
        ("DeclareTables", pb.DeclareTablesRequest(tables=[pb.TableSpec(name="t", dim=1 << 40)]), tables,
         "wider than"),
        ("DeclareTables", pb.DeclareTablesRequest(tables=[pb.TableSpec(name="t", dim=2, dtype="int64")]), tables,
         "dtype 'int64'"),
        ("DeclareTables", pb.DeclareTablesRequest(tables=[pb.TableSpec(name="t", dim=2, initializer="eval")]), tables,
         "eval"),
        ("Configure", pb.ConfigureRequest(sync=pb.SyncConfig(mode=7)), pb.ConfigureResponse, "sync mode"),
        ("Configure", pb.ConfigureRequest(num_ps=3), pb.ConfigureResponse, "expects 3 PS"),
        ("TaskProgress", pb.TaskProgressRequest(task_ids=range(MAX_TASK_IDS + 1)), pb.TaskProgressResponse,
         f"at most {MAX_TASK_IDS}"),
        ("Describe", b"\x0a\xff", pb.DescribeResponse, ""),  # not a DescribeRequest at all
    ]
    for method, request, response, says in unary:
        code = grpc.StatusCode.INTERNAL if method == "Describe" else INVALID  # gRPC's own deserializer refuses it
        expect(code, says, lambda: raw.unary(method, request, response))
        assert shard_state(client, directory) == before, (method, says)
    assert [t.name for t in client.describe()[0].tables] == ["emb"]
    assert client.pull_embedding("emb", [1]).shape == (1, DIM)


def test_messages_above_the_limit_are_refused_by_grpc(ps):
    _, client, raw, directory = ps
    before = shard_state(client, directory)
    over = MAX_PS_MESSAGE + (1 << 20)
    expect(TOO_BIG, "", lambda: raw.stream("PullEmbedding", pb.PullEmbeddingRequest(
        table="emb", ids=tensor("int64", [over // 8], bytes(over))), pb.PullEmbeddingChunk))
    # A push whose second message is over the limit: the PS may see its stream end cleanly after the
    # header, and refuses it only because the header announced a sparse block that never came (repeated:
    # which of the two the PS sees first is a race).
    n = over // (8 + 4 * DIM)
    big = sparse("emb", tensor("int64", [n], torch.arange(n).numpy().tobytes()), rows(n)).SerializeToString()
    for _ in range(10):
        expect((TOO_BIG, INVALID), "", lambda: raw.push(header(BAD_TASKS[-1], sparse_blocks=1), big))
    assert shard_state(client, directory) == before
    # Just under the limit, gRPC hands the message to the PS (which refuses the unknown table itself).
    under = MAX_PS_MESSAGE - (64 << 10)
    expect(INVALID, "unknown embedding table", lambda: raw.stream("PullEmbedding", pb.PullEmbeddingRequest(
        table="nope", ids=tensor("int64", [under // 8], bytes(under))), pb.PullEmbeddingChunk))
