"""flextrain.ps.export: a PS job's shards (checkpoint + write-ahead log) as one model state dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from flextrain.protocol.codec import RowBlock
from flextrain.protocol.shard import row_owner
from flextrain.ps.checkpoint import Checkpointer
from flextrain.ps.dense import Spec
from flextrain.ps.embedding import TableSpec
from flextrain.ps.export import ExportError, export_model, load_shards
from flextrain.ps.initializers import initial_rows
from flextrain.ps.optimizers import make_optimizer
from flextrain.ps.state import ShardState, SyncSettings


class Tiny(nn.Module):
    """Dense ``fc`` (on the PS by name), table ``emb`` (rows by id), and a frozen ``scale``."""

    def __init__(self, rows: int = 10, dim: int = 4):
        super().__init__()
        self.emb = nn.Embedding(rows, dim)
        self.fc = nn.Linear(dim, 1)
        self.scale = nn.Parameter(torch.full((1,), 3.0), requires_grad=False)


def _shards(directory, *, num_ps: int = 2, pushes: int = 3, wal_after: int = 0):
    """Shards as the trainer sets them up (fc split across PS by name), ``pushes`` SGD updates of rows 1
    and 7 each; the checkpoint is taken after ``pushes - wal_after`` of them, the rest only in the log."""
    model = Tiny()
    dense_owner = {"fc.weight": 0, "fc.bias": num_ps - 1}
    shards, ckpts = [], []
    for i in range(num_ps):
        shard = ShardState(i, num_ps, optimizer=make_optimizer("sgd", {"lr": 0.5}), sync=SyncSettings("async"))
        ckpt = Checkpointer(directory, i)
        ckpt.restore(shard)  # nothing yet: opens the log
        mine = [(n, p) for n, p in model.named_parameters() if dense_owner.get(n) == i]
        data = bytearray(b"".join(p.detach().numpy().tobytes() for _, p in mine))
        shard.init_dense([Spec(n, "float32", tuple(p.shape)) for n, p in mine], data)
        shard.declare_tables([TableSpec("emb", 4, seed=7)])
        shards.append(shard)
        ckpts.append(ckpt)
    for k in range(pushes):
        if k == pushes - wal_after:
            for shard, ckpt in zip(shards, ckpts):
                ckpt.save(shard)
        for shard in shards:
            store = shard.dense
            grads = bytearray(store.total_bytes)
            for g in store.wrap(grads).groups:
                g.fill_(1.0)
            mine = [i for i in (1, 7) if row_owner(i, num_ps) == shard.shard_index]
            shard.push(client_id="w", seq=k + 1, base_version=shard.version, layout_id=store.layout_id,
                       dense=grads, sparse=[RowBlock.of("emb", mine, torch.ones((len(mine), 4)))] if mine else [])
    if not wal_after:
        for shard, ckpt in zip(shards, ckpts):
            ckpt.save(shard)
    for ckpt in ckpts:
        ckpt.wal.close()
    return model


@pytest.mark.parametrize("wal_after", [0, 2], ids=["checkpointed", "last-updates-in-the-log"])
def test_the_export_is_the_model_a_worker_would_pull(tmp_path, wal_after):
    built = _shards(tmp_path, pushes=3, wal_after=wal_after)
    before = set(p.name for p in tmp_path.rglob("*"))
    state, version = export_model(Tiny(), tmp_path)
    assert set(p.name for p in tmp_path.rglob("*")) == before  # read only
    assert version == 3
    for name in ("fc.weight", "fc.bias"):  # three SGD steps of gradient 1 at lr 0.5
        assert torch.allclose(state[name], built.state_dict()[name] - 1.5), name
    init = initial_rows(table="emb", seed=7, initializer="normal", args={"mean": 0.0, "std": 1.0},
                        ids=np.arange(10, dtype=np.int64), dim=4, dtype=torch.float32)
    expected = init.clone()
    expected[[1, 7]] -= 1.5
    assert torch.allclose(state["emb.weight"], expected)  # rows never pulled: their initial values
    assert torch.equal(state["scale"], torch.full((1,), 3.0))  # not trained: as the model builds it
    model = Tiny()
    model.load_state_dict(state)


def test_a_missing_shard_or_a_model_that_does_not_match_is_named(tmp_path):
    _shards(tmp_path)
    with pytest.raises(ExportError, match=r"embedding table 'emb' has rows of 4 on the parameter servers, 8 in"):
        export_model(Tiny(dim=8), tmp_path)
    with pytest.raises(ExportError, match=r"holds row 7 on ps-\d, beyond this model's num_embeddings=5"):
        export_model(Tiny(rows=5), tmp_path)

    class Other(Tiny):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(1, 1)

    with pytest.raises(ExportError, match=r"hold no head.weight, head.bias of this model"):
        export_model(Other(), tmp_path)
    (tmp_path / "ps-1").rename(tmp_path / "ps-2")
    with pytest.raises(ExportError, match=r"ps-0, ps-2 are not ps-0 .. ps-1: a shard's files are missing"):
        load_shards(tmp_path)
    (tmp_path / "ps-2").rename(tmp_path / "ps-1")
    for f in (tmp_path / "ps-1").iterdir():
        f.unlink()
    with pytest.raises(ExportError, match=r"ps-1: no readable checkpoint or write-ahead log"):
        load_shards(tmp_path)
