"""Embedding tables: deterministic lazy rows, the id index, bad ids (in process and over gRPC)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from flextrain.elastic import statecodec
from flextrain.ps.embedding import EmbeddingTable, TableSpec
from flextrain.ps.idindex import IdIndex
from flextrain.protocol.shard import INT64_MAX


@pytest.mark.parametrize("snapshot", [True, False])
def test_row_blocks_in_order_and_updates_between_blocks_only_without_snapshot(snapshot):
    from flextrain.ps.optimizers import make_optimizer
    table = EmbeddingTable(TableSpec("t", 4, seed=3))
    ids = np.arange(100, 110)
    before = table.gather(ids)
    blocks = table.gather_blocks(ids, 4, snapshot=snapshot)
    first = next(blocks)
    table.apply(make_optimizer("sgd", {"lr": 1.0}), ids, torch.ones(10, 4))  # lands between two blocks
    rest = list(blocks)
    assert [len(b) for b in [first, *rest]] == [4, 4, 2]
    assert torch.equal(first, before[:4])
    assert torch.equal(torch.cat(rest), before[4:] if snapshot else before[4:] - 1)
    assert [len(b) for b in table.gather_blocks([], 4, snapshot=snapshot)] == [0]  # one empty block


def test_lazy_rows_depend_only_on_seed_table_and_id():
    a = EmbeddingTable(TableSpec("user", 8, seed=7))
    b = EmbeddingTable(TableSpec("user", 8, seed=7), capacity=1)  # other growth pattern
    ids = np.array([5, 2**62, 0, 123456789, 5])
    first = a.gather(ids)
    assert torch.equal(first[0], first[4])  # an id asked twice in one batch
    # Other order, other batches, another table object: same rows.
    for i in (3, 1, 0, 2):
        assert torch.equal(b.gather([int(ids[i])])[0], first[i])
    assert torch.equal(a.gather(ids), first)  # created once, not re-initialised
    assert len(a) == 4
    assert not torch.equal(EmbeddingTable(TableSpec("user", 8, seed=8)).gather(ids), first)
    assert not torch.equal(EmbeddingTable(TableSpec("item", 8, seed=7)).gather(ids), first)


@pytest.mark.parametrize("initializer,args,check", [
    ("normal", {"std": 0.5}, lambda x: abs(x.mean()) < 0.01 and abs(x.std() - 0.5) < 0.01),
    ("uniform", {"low": -1, "high": 3}, lambda x: x.min() >= -1 and x.max() < 3 and abs(x.mean() - 1) < 0.03),
    ("truncated_normal", {"std": 2}, lambda x: x.abs().max() <= 4 and 1.5 < x.std() < 1.9),
    ("zeros", {}, lambda x: (x == 0).all()),
    ("constant", {"value": 0.25}, lambda x: (x == 0.25).all()),
])
def test_initializers_have_the_right_distribution(initializer, args, check):
    rows = EmbeddingTable(TableSpec("t", 16, initializer=initializer, init_args=args)).gather(np.arange(5000))
    assert rows.dtype == torch.float32 and bool(check(rows.double()))


def test_bad_table_specs_are_clear_errors():
    with pytest.raises(ValueError, match="'t': unknown initializer 'xavier'"):
        EmbeddingTable(TableSpec("t", 4, initializer="xavier"))
    with pytest.raises(ValueError, match="'t': dim must be >= 1"):
        EmbeddingTable(TableSpec("t", 0))
    with pytest.raises(ValueError, match="takes high, low, not std"):
        EmbeddingTable(TableSpec("t", 4, initializer="uniform", init_args={"std": 1}))


@pytest.mark.parametrize("bad,shown", [([3, -1], "-1"), ([2**63], str(2**63)), ([INT64_MAX + 10], str(INT64_MAX + 10))])
def test_bad_ids_raise_value_error_naming_table_and_id(bad, shown):
    table = EmbeddingTable(TableSpec("clicks", 4))
    for call in (lambda: table.gather(bad), lambda: table.apply(None, bad, torch.zeros(len(bad), 4))):
        with pytest.raises(ValueError) as err:
            call()
        assert "'clicks'" in str(err.value) and shown in str(err.value)
    assert len(table) == 0


def test_id_index_matches_a_dict_under_collisions_and_growth():
    rng = np.random.default_rng(0)
    index, reference = IdIndex(capacity=4), {}
    for batch in range(30):
        # Ids in a narrow range collide in the hash table often; some large ones too.
        ids = np.unique(np.concatenate([rng.integers(0, 5000, 300), rng.integers(0, INT64_MAX, 20)]))
        ids = np.array([i for i in ids.tolist() if i not in reference], dtype=np.int64)
        rows = np.arange(len(reference), len(reference) + len(ids), dtype=np.int64)
        index.insert(ids, rows)
        reference.update(zip(ids.tolist(), rows.tolist()))
        probe = np.concatenate([rng.integers(0, 6000, 500), ids[:10]]).astype(np.int64)
        assert index.lookup(probe).tolist() == [reference.get(i, -1) for i in probe.tolist()]
    assert index.size == len(reference)


def test_table_state_round_trips_through_statecodec():
    from flextrain.ps.optimizers import make_optimizer

    table = EmbeddingTable(TableSpec("t", 3, seed=1))
    opt = make_optimizer("adagrad", {"lr": 0.1, "initial_accumulator_value": 0.2})
    table.apply(opt, [4, 9], torch.ones(2, 3))
    with table.lock:
        blob = statecodec.encode(table.state())
    back = EmbeddingTable.from_state(statecodec.decode(blob))
    assert torch.equal(back.gather([9, 4]), table.gather([9, 4]))
    back.apply(opt, [4], torch.ones(1, 3))
    table.apply(opt, [4], torch.ones(1, 3))
    assert torch.equal(back.gather([4, 123]), table.gather([4, 123]))  # slots and steps came back too


def test_bad_ids_over_grpc_client_and_server_side(start_cluster):
    from flextrain.proto import flextrain_pb2 as fpb
    from flextrain.proto import ps_pb2 as pb

    (ps,), client = start_cluster(1, optimizer="sgd")
    c = client()
    c.declare_table("ads", 4)
    with pytest.raises(ValueError, match=r"'ads': id -3 is out of range"):
        c.pull_embedding("ads", [1, -3])
    with pytest.raises(ValueError, match=rf"'ads': id {2**63} is out of range"):
        c.push(sparse_grads={"ads": ([2**63], torch.zeros(1, 4))})
    # A client that skips validation still cannot create row -3 on the PS.
    stub = c._stubs[0].rpc
    bad = np.array([5, -3], dtype=np.int64)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.PullEmbedding(pb.PullEmbeddingRequest(table="ads", ids=fpb.Tensor(
            dtype="int64", shape=[2], data=bad.tobytes())), timeout=5))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'ads'" in err.value.details()
    assert "-3" in err.value.details()
    with pytest.raises(ValueError, match="unknown embedding table 'nope'"):
        c.pull_embedding("nope", [1])
    assert ps.shard.info()["table_rows"] == {"ads": 0}


def test_pull_embedding_keeps_shape_order_and_duplicates(start_cluster):
    _, client = start_cluster(3, optimizer="sgd")
    c = client()
    c.declare_table("e", 5, seed=2, initializer="uniform")
    ids = np.random.default_rng(1).integers(0, 40, size=(6, 7))
    rows = c.pull_embedding("e", torch.from_numpy(ids))
    assert rows.shape == (6, 7, 5)
    reference = EmbeddingTable(TableSpec("e", 5, initializer="uniform", seed=2)).gather(ids.reshape(-1))
    assert torch.equal(rows.reshape(-1, 5), reference)  # and the same rows any PS would create
    assert c.pull_embedding("e", []).shape == (0, 5)
    one = c.pull_embedding("e", 1000)  # a scalar id gives one row
    assert one.shape == (5,)
    assert torch.equal(one, EmbeddingTable(TableSpec("e", 5, initializer="uniform", seed=2)).gather([1000])[0])
    # out=: the rows land in the caller's tensor (reused across pulls), with and without the grouped layout
    buf = torch.full((6, 7, 5), float("nan"))
    assert c.pull_embedding("e", torch.from_numpy(ids), out=buf) is buf and torch.equal(buf, rows)
    distinct = c.distinct("e", ids)[0]
    grouped = torch.empty(len(distinct), 5, dtype=torch.float32)
    assert c.pull_embedding("e", distinct, out=grouped) is grouped
    fresh = c.pull_embedding("e", distinct)
    assert torch.equal(grouped, fresh) and fresh.data_ptr() != grouped.data_ptr()
    with pytest.raises(ValueError, match=r"out= for table 'e' must be .* shape \(6, 7, 5\) .*got \(6, 7, 4\)"):
        c.pull_embedding("e", ids, out=torch.empty(6, 7, 4))
    with pytest.raises(ValueError, match=r"dtype torch.float32"):
        c.pull_embedding("e", ids, out=torch.empty(6, 7, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"contiguous=False"):
        c.pull_embedding("e", ids, out=torch.empty(7, 6, 5).transpose(0, 1))
