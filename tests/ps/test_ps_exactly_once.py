"""Exactly once on the PS: minibatch keys, task progress, flush, and the write-ahead log.

Real in-process PS servers on loopback; a restart is a new server on the same
checkpoint directory after the old one stopped without a final checkpoint
(what a SIGKILL leaves behind; tests/ps/test_ps_fault.py kills a real process).
"""

from __future__ import annotations

import torch

from flextrain.ps.main import start_ps
from flextrain.ps.walfiles import frame, read_records
from flextrain.protocol.shard import dense_owner
from flextrain.worker.ps_client import PSClient

W0 = torch.zeros(4)
assert (dense_owner("w", 2), dense_owner("a", 2)) == (0, 1)  # one dense parameter on each of 2 PS


def _setup(client: PSClient, *, lr: float = 1.0) -> None:
    client.configure("sgd", {"lr": lr})
    client.init_dense({"w": W0.clone(), "a": W0.clone()})  # crc32 puts "w" and "a" on different PS of 2
    client.declare_table("e", 2, initializer="zeros")
    client.pull_dense(None)


def test_a_minibatch_pushed_again_by_another_worker_is_applied_once_per_ps(start_cluster):
    _, client = start_cluster(2, mode="async")
    first, second = client(client_id="a"), client(client_id="b")
    _setup(first)
    g = {"w": torch.ones(4), "a": torch.ones(4)}
    rows = ([3, 4, 5, 6], torch.ones(4, 2))
    r1 = first.push(g, {"e": rows}, step=(7, 100, 132))
    assert r1.accepted and r1.applied and r1.duplicates == (False, False)
    second.pull_dense(None)
    r2 = second.push(g, {"e": rows}, step=(7, 100, 132))  # the task was requeued; the same records again
    assert r2.accepted and not r2.applied and r2.duplicates == (True, True)
    assert "already accepted" in r2.messages[0]
    _, params = second.pull_dense(None)
    assert torch.equal(params["w"], -torch.ones(4)) and torch.equal(params["a"], -torch.ones(4))
    assert torch.equal(second.pull_embedding("e", [3, 4, 5, 6]), -torch.ones(4, 2))
    assert first.task_progress(7) == (132, 132)
    assert first.task_progress(8) == (-1, -1)
    # the next minibatch of the task is new
    assert second.push(g, step=(7, 132, 164)).applied
    assert second.task_progress(7) == (164, 164)


def test_a_push_cut_off_between_two_ps_is_completed_where_it_is_missing(start_cluster):
    handles, client = start_cluster(2, mode="async")
    c = client(client_id="taker")
    _setup(c)
    # The dying worker's push reached PS 0 only (sent to its shard directly).
    owner_of_w = 0 if "w" in {t.name for t in c.describe()[0].layout.tensors} else 1
    shard = handles[owner_of_w].shard
    grad = bytearray(shard.dense.total_bytes)
    torch.frombuffer(grad, dtype=torch.float32)[:] = 1.0
    assert shard.push(client_id="dead", seq=1, base_version=0, layout_id=shard.dense.layout_id, dense=grad,
                      step=(3, 0, 32)).applied
    assert c.task_progress(3)[owner_of_w] == 32 and c.task_progress(3)[1 - owner_of_w] == -1
    r = c.push({"w": torch.ones(4), "a": torch.ones(4)}, step=(3, 0, 32))
    assert r.accepted and r.duplicates[owner_of_w] and not r.duplicates[1 - owner_of_w]
    _, params = c.pull_dense(None)
    assert torch.equal(params["w"], -torch.ones(4)) and torch.equal(params["a"], -torch.ones(4))  # once each


def test_sync_stale_rejection_on_one_ps_does_not_apply_twice_on_the_other(start_cluster):
    handles, client = start_cluster(2, mode="sync")
    a = client(client_id="a")
    _setup(a)
    # another worker's update reaches the PS of "a" first:
    owner_of_a = 0 if "a" in {t.name for t in a.describe()[0].layout.tensors} else 1
    shard = handles[owner_of_a].shard
    grad = bytearray(shard.dense.total_bytes)
    assert shard.push(client_id="other", seq=1, base_version=0, layout_id=shard.dense.layout_id, dense=grad,
                      step=(1, 0, 8)).applied  # that PS is now at version 1
    g = {"w": torch.ones(4), "a": torch.ones(4)}
    r = a.push(g, step=(2, 0, 8))  # computed from version 0 everywhere: stale on one PS only
    assert not r.accepted and r.applied  # the other PS accepted (and applied) it
    a.pull_dense(a.version)
    r = a.push(g, step=(2, 0, 8))  # recomputed after a fresh pull and pushed to both again
    assert r.accepted and r.duplicates[1 - owner_of_a] and not r.duplicates[owner_of_a]
    _, params = a.pull_dense(None)
    assert torch.equal(params["w"], -torch.ones(4)) and torch.equal(params["a"], -torch.ones(4))


def test_flush_applies_sync_gradients_held_back(start_cluster):
    _, client = start_cluster(1, mode="sync", grads_to_wait=2)
    c = client()
    _setup(c)
    r = c.push({"w": torch.full((4,), 2.0), "a": torch.ones(4)}, step=(0, 0, 10))
    assert r.accepted and not r.applied and c.describe()[0].pending_pushes == 1
    assert c.flush() == 1
    assert c.describe()[0].pending_pushes == 0
    _, params = c.pull_dense(None)
    assert torch.equal(params["w"], torch.full((4,), -2.0))  # the one gradient, averaged over one push
    assert c.flush() == 1  # nothing pending: a no-op


def _restart(handle, **kwargs):
    handle.stop(grace=0.2, checkpoint=False)  # like SIGKILL: no final checkpoint
    return start_ps(shard_index=0, num_ps=1, host="127.0.0.1", **kwargs)


def test_log_restores_everything_acknowledged_without_any_checkpoint(tmp_path, start_cluster):
    settings = dict(checkpoint_dir=tmp_path / "ck", checkpoint_every=0, mode="sync", grads_to_wait=2)
    (h,), client = start_cluster(1, **settings)
    c = client()
    _setup(c, lr=0.5)
    gens = [torch.Generator().manual_seed(k) for k in range(3)]
    grads = [{"w": torch.randn(4, generator=g), "a": torch.randn(4, generator=g)} for g in gens]
    rows = [([1, 9], torch.randn(2, 2, generator=g)) for g in gens]
    assert c.push(grads[0], {"e": rows[0]}, step=(0, 0, 4)).accepted
    assert c.push(grads[1], {"e": rows[1]}, step=(0, 4, 8)).applied  # version 1: the mean of two
    c.pull_dense(c.version)
    assert not c.push(grads[2], {"e": rows[2]}, step=(0, 8, 12)).applied  # held back: 1 of 2
    assert not list((tmp_path / "ck" / "ps-0").glob("*.ckpt"))

    h2 = _restart(h, **settings)
    try:
        c2 = PSClient([h2.address], give_up=5, deadline=10)
        info = c2.describe()[0]
        assert info.version == 1 and info.pending_pushes == 1 and info.optimizer.name == "sgd"
        assert c2.task_progress(0) == (12,)
        assert c2.push(grads[2], step=(0, 8, 12)).duplicates == (True,)  # a retry of the held-back one
        assert c2.flush() == 2
        _, params = c2.pull_dense(None)
        expect_w = -0.5 * (grads[0]["w"] + grads[1]["w"]) / 2 - 0.5 * grads[2]["w"]
        torch.testing.assert_close(params["w"], expect_w)
        expect_row9 = -0.5 * (rows[0][1][1] + rows[1][1][1]) / 2 - 0.5 * rows[2][1][1]
        torch.testing.assert_close(c2.pull_embedding("e", [9])[0], expect_row9)
        c2.close()
    finally:
        h2.stop(grace=0.2, checkpoint=False)


def test_a_torn_log_record_is_dropped_and_the_rest_replayed(tmp_path, start_cluster):
    settings = dict(checkpoint_dir=tmp_path / "ck", checkpoint_every=2, mode="async")
    (h,), client = start_cluster(1, **settings)
    c = client()
    _setup(c)
    for k in range(3):  # checkpoint at 2, then version 3 in the log
        assert c.push({"w": torch.ones(4)}, step=(k, 0, 1)).applied
    h.checkpointer.flush(5)
    number, lsn = h.shard.wal.number, h.shard.wal.appended
    h.stop(grace=0.2, checkpoint=False)
    segment = tmp_path / "ck" / "ps-0" / f"wal-{number}.log"
    _, good = read_records(segment)
    prefix = b"\x04\x40\x00\x00\x00" + b"{" * 0x40  # a PUSH record's start: the kill cut it off here
    with open(segment, "r+b") as f:
        f.seek(good)
        f.write(frame(lsn + 1, number, prefix, [b"\x01" * 64]) + prefix[:7])
    h2 = start_ps(shard_index=0, num_ps=1, host="127.0.0.1", **settings)
    try:
        assert h2.shard.version == 3
        assert read_records(segment)[1] == good  # the torn record is not part of the log
        torch.testing.assert_close(h2.shard.dense.params.views["w"], torch.full((4,), -3.0))
        c2 = PSClient([h2.address], give_up=5, deadline=10, client_id="again")
        assert c2.push({"w": torch.ones(4)}, step=(3, 0, 1)).applied  # logged after the torn record's LSN
        c2.close()
    finally:
        h2.stop(grace=0.2, checkpoint=False)
    h3 = start_ps(shard_index=0, num_ps=1, host="127.0.0.1", **settings)
    try:  # the log goes on past the segment with the torn record: version 4 comes back
        assert h3.shard.version == 4
        torch.testing.assert_close(h3.shard.dense.params.views["w"], torch.full((4,), -4.0))
    finally:
        h3.stop(grace=0.2, checkpoint=False)


def test_a_durable_ps_holding_no_dense_parameter_serves_and_restores(tmp_path, start_cluster):
    # "w" lives on PS 0: PS 1 logs an empty dense init (an empty blob must not stall the log)
    settings = dict(checkpoint_dir=tmp_path / "ck", checkpoint_every=0, mode="async")
    handles, client = start_cluster(2, **settings)
    c = client()
    c.configure("sgd", {"lr": 1.0})
    c.init_dense({"w": W0.clone()})
    assert [info.dense_initialized for info in c.describe()] == [True, True]
    c.declare_table("e", 2, initializer="zeros")
    c.pull_dense(None)
    assert c.push({"w": torch.ones(4)}, {"e": ([1, 2, 3, 4], torch.ones(4, 2))}, step=(0, 0, 4)).accepted
    handles[1].stop(grace=0.2, checkpoint=False)
    h1 = start_ps(shard_index=1, num_ps=2, host="127.0.0.1", **settings)
    try:
        assert h1.shard.version == 1 and h1.shard.dense.total_bytes == 0
        assert h1.shard.task_progress([0]) == [4]
    finally:
        h1.stop(grace=0.2, checkpoint=False)


def test_a_log_record_with_a_damaged_payload_ends_the_segment(tmp_path):
    from flextrain.ps.dense import Spec
    from flextrain.ps.wal import WriteAheadLog

    wal = WriteAheadLog(tmp_path)
    wal.open_segment(0)
    wal.log_init_dense([Spec("w", "float32", (3,))], bytearray(torch.arange(3.0).numpy().tobytes()))
    wal.log_init_dense([Spec("w", "float32", (5,))], bytearray(torch.arange(5.0).numpy().tobytes()))
    wal.close()
    path = tmp_path / "wal-0.log"
    records, good = read_records(path)
    assert [r[1]["specs"][0][2] for r in records] == [[3], [5]]
    data = bytearray(path.read_bytes())
    data[good - 3] ^= 0xFF  # a byte of the second record's gradient bytes
    path.write_bytes(bytes(data))
    records, shorter = read_records(path)
    assert len(records) == 1 and shorter < good  # the damaged record and what follows are not replayed
