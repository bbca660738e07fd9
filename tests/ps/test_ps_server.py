"""PS over real gRPC on loopback: init, pull, push in SYNC and ASYNC modes, errors, big pushes."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from flextrain.proto import flextrain_pb2 as fpb
from flextrain.proto import ps_pb2 as pb
from flextrain.protocol.shard import dense_owner
from flextrain.worker.ps_client import PSClient, PSError


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {"emb_proj.weight": (8, 4), "fc1.weight": (16, 8), "fc1.bias": (16,), "fc2.weight": (3, 16),
              "fc2.bias": (3,), "scale": (), "double.weight": (5,)}
    out = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    out["double.weight"] = out["double.weight"].double()  # a second dtype group in the arena
    return out


def test_init_dense_first_writer_wins_and_pull_returns_it(start_cluster):
    _, client = start_cluster(2, optimizer="sgd")
    a, b = client(), client()
    model = _model(0)
    assert {dense_owner(n, 2) for n in model} == {0, 1}
    assert a.init_dense(model) == 0
    assert b.init_dense(_model(1)) == 0  # different values, same names: a no-op
    version, params = b.pull_dense(None)
    assert version == 0 and set(params) == set(model)
    for name, t in model.items():
        assert params[name].dtype == t.dtype and torch.equal(params[name], t)
    assert b.pull_dense(version) == (0, None)  # unchanged: no payload
    with pytest.raises(ValueError, match="differ from this model's"):
        client().init_dense({"other.weight": torch.zeros(2)})


def test_async_push_applies_at_once_and_pull_into_out_tensors(start_cluster):
    _, client = start_cluster(2, optimizer="sgd", hyper={"lr": 0.5}, mode="async")
    c = client()
    model = _model()
    c.init_dense(model)
    version, _ = c.pull_dense(None)
    grads = {n: torch.ones_like(t) for n, t in model.items()}
    del grads["fc2.bias"]  # no gradient: untouched
    result = c.push(grads, version=version)
    assert result.accepted and result.applied and result.versions == (1, 1)
    out = {n: torch.zeros_like(t) for n, t in model.items()}
    version, params = c.pull_dense(version, out=out)
    assert version == 1 and all(params[n] is out[n] for n in out)
    for n, t in model.items():
        torch.testing.assert_close(out[n], t if n == "fc2.bias" else t - 0.5)


def _run_sync(start_cluster, num_ps: int, workers: int, steps: int):
    _, client = start_cluster(num_ps, optimizer="adam", hyper={"lr": 0.01, "weight_decay": 0.01},
                              mode="sync", grads_to_wait=workers)
    clients = [client() for _ in range(workers)]
    model = _model(3)
    for c in clients:
        c.init_dense(model)
        c.pull_dense(None)
    gen = torch.Generator().manual_seed(9)
    history = []
    for step in range(steps):
        grads = [{n: torch.randn(t.shape, generator=gen, dtype=t.dtype) for n, t in model.items()} for _ in clients]
        history.append(grads)
        results = [c.push(g) for c, g in zip(clients, grads)]
        assert all(r.accepted for r in results)
        assert not results[0].applied and results[-1].applied and results[-1].version == step + 1
        for c in clients:
            version, params = c.pull_dense(c.version)
            assert version == step + 1 and params is not None
    return params, model, history


def test_sync_two_ps_two_workers_equals_single_process_reference(start_cluster):
    params, model, history = _run_sync(start_cluster, num_ps=2, workers=2, steps=4)
    ref = {n: torch.nn.Parameter(t.clone()) for n, t in model.items()}
    opt = torch.optim.Adam(ref.values(), lr=0.01, weight_decay=0.01)
    for grads in history:
        for n, p in ref.items():
            p.grad = (grads[0][n] + grads[1][n]) / 2
        opt.step()
    for n, p in ref.items():
        torch.testing.assert_close(params[n], p.detach(), rtol=1e-6, atol=1e-7)


def test_sync_rejects_stale_gradients_and_long_poll_returns_on_update(start_cluster):
    import threading

    _, client = start_cluster(1, optimizer="sgd", mode="sync", grads_to_wait=2, version_tolerance=1)
    a, b = client(), client()
    a.init_dense({"w": torch.zeros(3)})
    for c in (a, b):
        c.pull_dense(None)
    g = {"w": torch.ones(3)}
    for _ in range(2):  # version 0 -> 2
        a.push(g)
        b.push(g)
    a.pull_dense(None)
    assert a.version == 2
    assert b.push(g, version=1).accepted  # 1 >= 2 - tolerance
    stale = b.push(g, version=0)
    assert not stale.accepted and "stale gradient" in stale.messages[0] and stale.version == 2
    seen = {}
    b.pull_dense(None)  # b now holds version 2; wait for the next
    waiter = threading.Thread(target=lambda: seen.update(r=b.pull_dense(b.version, wait=10)))
    waiter.start()
    assert a.push(g).applied  # the second push of version 2 -> 3
    waiter.join(10)
    assert seen["r"][0] == 3 and seen["r"][1] is not None


def test_async_staleness_scales_lr_and_max_staleness_rejects(start_cluster):
    _, client = start_cluster(1, optimizer="sgd", hyper={"lr": 1.0}, mode="async", staleness_lr=True,
                              max_staleness=3)
    c = client()
    c.init_dense({"w": torch.zeros(1)})
    c.pull_dense(None)
    for _ in range(2):
        c.push({"w": torch.ones(1)})  # base 0: staleness 0 then 1
    _, params = c.pull_dense(None)
    torch.testing.assert_close(params["w"], torch.tensor([-1.0 - 0.5]))
    c.push({"w": torch.ones(1)}, version=0)  # PS at 2: staleness 2 -> lr / 3
    assert not c.push({"w": torch.ones(1)}, version=-1).accepted  # staleness 4 > 3


def test_retried_push_is_applied_once(start_cluster):
    (ps,), client = start_cluster(1, optimizer="sgd", hyper={"lr": 1.0}, mode="async")
    c = client()
    c.init_dense({"w": torch.zeros(2)})
    c.pull_dense(None)
    first = ps.shard.push(client_id="w0", seq=7, base_version=0, layout_id=ps.shard.dense.layout_id,
                          dense=bytearray(np.ones(2, np.float32).tobytes()))
    again = ps.shard.push(client_id="w0", seq=7, base_version=0, layout_id=ps.shard.dense.layout_id,
                          dense=bytearray(np.ones(2, np.float32).tobytes()))
    assert first == again and ps.shard.version == 1
    older = ps.shard.push(client_id="w0", seq=6, base_version=0)
    assert not older.accepted and ps.shard.version == 1


def test_sparse_push_through_grpc_and_lowering_grads_to_wait(start_cluster):
    _, client = start_cluster(2, optimizer="adagrad", hyper={"lr": 0.1}, mode="sync", grads_to_wait=3)
    c = client()
    c.declare_table("e", 4, initializer="zeros")
    c.declare_table("e", 4, initializer="zeros")  # idempotent
    with pytest.raises(ValueError, match="already declared"):
        c.declare_table("e", 8)
    ids = np.array([1, 2, 3, 1])
    assert torch.equal(c.pull_embedding("e", ids), torch.zeros(4, 4)) and c.versions == (0, 0)
    assert not c.push(sparse_grads={"e": (ids, torch.ones(4, 4))}).applied
    assert all(d.pending_pushes == 1 for d in c.describe())
    c.configure(grads_to_wait=1)  # a worker left: the pending push completes the step
    rows = c.pull_embedding("e", [1, 2, 3, 4])
    # Adagrad from zero: -lr * g / sqrt(g^2) = -lr per element; id 1's two gradients were summed first.
    torch.testing.assert_close(rows[:3], torch.full((3, 4), -0.1))
    assert torch.equal(rows[3], torch.zeros(4))
    assert {d.version for d in c.describe()} == {1}


@pytest.mark.parametrize("layout", ["grouped", "sorted", "random"])
def test_rows_move_the_same_in_any_id_layout(start_cluster, layout):
    _, client = start_cluster(2, optimizer="sgd", hyper={"lr": 1.0}, mode="async")
    c = client()
    c.declare_table("e", 3, seed=4)
    raw = np.random.default_rng(1).integers(0, 1 << 50, 500)
    distinct, _ = c.distinct("e", raw)
    ids = {"grouped": distinct, "sorted": np.sort(distinct),
           "random": np.random.default_rng(2).permutation(distinct)}[layout]
    before = c.pull_embedding("e", ids)
    reference = {int(i): before[k] for k, i in enumerate(ids)}
    grads = torch.arange(len(ids) * 3, dtype=torch.float32).reshape(-1, 3)
    assert c.push(sparse_grads={"e": (ids, grads)}).applied
    after = c.pull_embedding("e", distinct)  # the trainer's layout
    for k, i in enumerate(distinct):  # every row moved by exactly its own gradient (lr 1)
        j = int(np.nonzero(ids == i)[0][0])
        torch.testing.assert_close(after[k], reference[int(i)] - grads[j])


def test_configuration_errors_are_clear(start_cluster):
    _, client = start_cluster(1)
    c = client()
    with pytest.raises(ValueError) as err:
        c.configure("lamb", {"lr": 0.1})
    assert "unknown optimizer 'lamb'" in str(err.value) and "adagrad, adam, adamw, momentum, sgd" in str(err.value)
    assert "127.0.0.1" in str(err.value)  # names the PS
    c.init_dense({"w": torch.zeros(1)})
    with pytest.raises(PSError, match="no optimizer configured"):
        c.push({"w": torch.ones(1)})
    c.configure("momentum", {"lr": 0.1})
    c.configure("momentum", {"lr": 0.1})  # same again: fine
    with pytest.raises(PSError, match="cannot switch"):
        c.configure("adam")
    with pytest.raises(ValueError, match="unknown dense parameter"):
        c.push({"nope": torch.ones(1)})
    with pytest.raises(ValueError, match="shape"):
        c.push({"w": torch.ones(2)})
    twice = PSClient([c.addresses[0]] * 2, give_up=1)  # thinks there are 2 PS
    with pytest.raises(ValueError, match="expects 2 PS"):
        twice.configure(grads_to_wait=1)
    twice.close()


def test_unknown_optimizer_at_start():
    from flextrain.ps.main import start_ps

    with pytest.raises(ValueError, match="unknown optimizer 'sgdd'.*known: adagrad"):
        start_ps(optimizer="sgdd", port=0, host="127.0.0.1")


def test_64mib_push_and_pull_through_the_message_limits(start_cluster):
    from flextrain.protocol.limits import MAX_PS_MESSAGE

    (ps,), client = start_cluster(1, optimizer="sgd", hyper={"lr": 1.0}, mode="async")
    c = client()
    big = torch.zeros(16 * 1024 * 1024)  # 64 MiB of float32
    c.init_dense({"big": big, "small": torch.zeros(3)})
    version, _ = c.pull_dense(None)
    grad = torch.arange(big.numel(), dtype=torch.float32)
    assert c.push({"big": grad, "small": torch.ones(3)}, version=version).accepted
    _, params = c.pull_dense(version)
    assert torch.equal(params["big"], -grad) and torch.equal(params["small"], -torch.ones(3))
    # The limits really are flextrain.protocol.limits': one message 1 MiB above them is refused.
    stub = c._stubs[0].rpc
    over = MAX_PS_MESSAGE + (1 << 20)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.PullEmbedding(pb.PullEmbeddingRequest(table="x", ids=fpb.Tensor(
            dtype="int64", shape=[over // 8], data=bytes(over))), timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_long_polls_cannot_take_every_handler_thread(start_cluster):
    import threading
    import time

    _, client = start_cluster(1, optimizer="sgd", mode="sync", grads_to_wait=2, threads=4)  # 2 may wait
    clients = [client() for _ in range(3)]
    clients[0].init_dense({"w": torch.zeros(1)})
    for c in clients:
        c.pull_dense(None)
    done = []

    def poll(c):
        t = time.monotonic()
        c.pull_dense(c.version, wait=3)
        done.append(time.monotonic() - t)

    threads = [threading.Thread(target=poll, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(0.5)
    assert len(done) == 1 and done[0] < 0.5  # the third poll was answered at once
    # Pushes are still served while two polls wait, and they wake the waiters.
    clients[0].push({"w": torch.ones(1)})
    assert clients[1].push({"w": torch.ones(1)}).applied
    for t in threads:
        t.join(5)
    assert len(done) == 3 and max(done) < 2.5
