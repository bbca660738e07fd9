"""Shard checkpoints in process: layout on disk, keep-last-2, exact restore, corrupt files."""

from __future__ import annotations

import time

import numpy as np
import torch

from flextrain.ps.checkpoint import Checkpointer
from flextrain.protocol.codec import RowBlock
from flextrain.ps.dense import Spec
from flextrain.ps.embedding import TableSpec
from flextrain.ps.optimizers import make_optimizer
from flextrain.ps.state import ShardState, SyncSettings


def _shard() -> ShardState:
    shard = ShardState(1, 2, optimizer=make_optimizer("adam", {"lr": 0.1}), sync=SyncSettings("async"))
    data = bytearray(np.arange(6, dtype=np.float32).tobytes() + np.ones(2, np.float64).tobytes())
    shard.init_dense([Spec("w", "float32", (2, 3)), Spec("d", "float64", (2,))], data)
    shard.declare_tables([TableSpec("e", 4, seed=3)])
    return shard


def _step(shard: ShardState, k: int) -> None:
    store = shard.dense
    grads = bytearray(store.total_bytes)
    arena = store.wrap(grads)
    for g in arena.groups:
        g.fill_(0.1 * k)
    shard.push(client_id="c", seq=k, base_version=shard.version, layout_id=store.layout_id, dense=grads,
               sparse=[RowBlock.of("e", [k % 3, 100], torch.full((2, 4), float(k)))])


def _wait_for(path, timeout=10):
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return path.exists()


def test_every_k_versions_keeps_two_and_restores_exactly(tmp_path):
    shard = _shard()
    ckpt = Checkpointer(tmp_path, shard_index=1, every=3)
    ckpt.attach(shard)
    for k in range(1, 10):
        _step(shard, k)
    assert _wait_for(tmp_path / "ps-1" / "version-9.ckpt") and ckpt.flush(10)
    # Versions 3, 6 and 9 were due; those the disk could not keep up with may be skipped (only the
    # newest pending snapshot is written: on a busy machine both 3 and 6 can be), and only the
    # last two files are kept.
    kept = [v for v, _ in ckpt.checkpoints()]
    assert kept in ([3, 9], [6, 9], [9])

    restored = ShardState(1, 2)
    assert Checkpointer(tmp_path, 1).restore(restored) == 9
    assert restored.version == 9 and restored.optimizer.describe() == shard.optimizer.describe()
    assert restored.sync == shard.sync and restored.dense.layout_id == shard.dense.layout_id
    # Same state, same next step (parameters, Adam moments, per-parameter and per-row steps).
    _step(shard, 10)
    _step(restored, 10)
    for name in ("w", "d"):
        assert torch.equal(restored.dense.params.views[name], shard.dense.params.views[name])
    ids = np.array([0, 1, 2, 100, 555])
    assert torch.equal(restored.table("e").gather(ids), shard.table("e").gather(ids))


def test_restore_skips_a_corrupt_newest_checkpoint_and_refuses_other_shards(tmp_path):
    shard = _shard()
    ckpt = Checkpointer(tmp_path, 1)
    _step(shard, 1)
    ckpt.save(shard)
    _step(shard, 2)
    path, version = ckpt.save(shard)
    assert version == 2 and path.name == "version-2.ckpt"
    path.write_bytes(path.read_bytes()[:100])  # torn or damaged
    (path.parent / ".version-3.ckpt.tmp-1-2").write_bytes(b"junk")  # left by a kill mid-write
    restored = ShardState(1, 2)
    assert ckpt.restore(restored) == 1
    assert not (path.parent / ".version-3.ckpt.tmp-1-2").exists()
    # A checkpoint of shard 1 is not loaded into shard 0, even if copied into its directory.
    (tmp_path / "ps-0").mkdir()
    (tmp_path / "ps-0" / "version-1.ckpt").write_bytes((path.parent / "version-1.ckpt").read_bytes())
    assert Checkpointer(tmp_path, 0).restore(ShardState(0, 2)) is None


def test_launcher_sync_settings_win_over_the_checkpoint(tmp_path):
    shard = _shard()
    Checkpointer(tmp_path, 1).save(shard)
    restored = ShardState(1, 2)
    Checkpointer(tmp_path, 1).restore(restored, keep_sync=SyncSettings("sync", grads_to_wait=4))
    assert restored.sync.mode == "sync" and restored.sync.grads_to_wait == 4
