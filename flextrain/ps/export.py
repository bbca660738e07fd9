"""A ParameterServer job's model as one ordinary checkpoint, read from its shards' files.

The model of a PS job lives on its parameter servers: dense parameters by
name, every ``nn.Embedding`` as a table named by its module path (the worker's
convention, ``flextrain/worker/ps_trainer.py``), rows by id. Evaluation-only
and prediction jobs load one checkpoint file into the module's model, so
``flextrain evaluate/predict --checkpoint PS_JOB_DIR`` first assembles one
here: each shard's newest checkpoint plus its write-ahead log (what a
relaunched PS would restore), read without writing anything, so a job still
running, or read-only files, are fine.

A row no worker ever pulled was never created; its value is the one the
table's initializer gives that id (it depends only on seed, table and id,
``flextrain/ps/initializers.py``), exactly what a worker would have pulled.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from flextrain.protocol.shard import row_owners
from flextrain.ps.checkpoint import load_newest
from flextrain.ps.state import ShardState
from flextrain.ps.walfiles import segments
from flextrain.ps.walreplay import replay

_SHARD_DIR = re.compile(r"^ps-(\d+)$")


class ExportError(ValueError):
    """The shards cannot make a checkpoint of this model; the message says which file or parameter."""


def load_shards(directory: str | Path) -> list[ShardState]:
    """Every shard of ``directory`` (a job's ``ps-checkpoints/``) as a relaunched PS would restore it:
    the newest readable checkpoint, then the write-ahead log after it. Nothing is written."""
    directory = Path(directory)
    found = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _SHARD_DIR.match(p.name)))
    if not found:
        raise ExportError(f"{directory}: no parameter-server shard directories (ps-0, ps-1, ...)")
    num_ps = len(found)
    if [i for i, _ in found] != list(range(num_ps)):
        raise ExportError(f"{directory}: shard directories {', '.join(p.name for _, p in found)} are not "
                          f"ps-0 .. ps-{num_ps - 1}: a shard's files are missing")
    shards = []
    for index, path in found:
        shard = ShardState(index, num_ps)
        _, wal_lsn = load_newest(shard, path)
        if wal_lsn >= 0 and segments(path):
            replay(shard, path, after=wal_lsn)  # shard.wal is None: replaying logs nothing
        if shard.dense is None and not shard.tables:
            raise ExportError(f"{path}: no readable checkpoint or write-ahead log: the shard holds no model")
        shards.append(shard)
    return shards


def export_model(model: nn.Module, directory: str | Path) -> tuple[dict[str, torch.Tensor], int]:
    """``(state dict for model, version)`` from the shards in ``directory``: the trainable parameters from
    the dense stores, each ``nn.Embedding``'s weight from its table, the rest as the model holds it
    (parameters that do not train keep their built values, as they did in training). The version is
    the highest of the shards'. Raises ExportError when the shards and the model do not agree."""
    shards = load_shards(directory)
    dense: dict[str, torch.Tensor] = {}
    for shard in shards:
        if shard.dense is not None:
            dense.update(shard.dense.params.views)
    tables = {name: module for name, module in model.named_modules() if isinstance(module, nn.Embedding)}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, module in tables.items():
        state[f"{name}.weight" if name else "weight"] = _table_weight(shards, name, module, directory)
    embedded = {id(m.weight) for m in tables.values()}
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in embedded]
    missing = [n for n, _ in trained if n not in dense]
    if missing:
        raise ExportError(f"{directory}: the parameter servers hold no {', '.join(missing)} of this model "
                          f"(they hold {', '.join(sorted(dense)) or 'no dense parameters'}): is it the module "
                          "the job trained?")
    for n, p in trained:
        value = dense[n]
        if value.shape != p.shape:
            raise ExportError(f"{directory}: parameter {n} is {tuple(value.shape)} on the parameter servers, "
                              f"{tuple(p.shape)} in this model")
        state[n] = value.clone().to(p.dtype)
    return state, max(shard.version for shard in shards)


def _table_weight(shards: list[ShardState], name: str, module: nn.Embedding, directory) -> torch.Tensor:
    rows, dim = module.num_embeddings, module.embedding_dim
    weight = torch.empty((rows, dim), dtype=module.weight.dtype)
    ids = np.arange(rows, dtype=np.int64)
    owners = row_owners(ids, len(shards))
    for shard in shards:
        table = shard.tables.get(name)
        if table is None:
            raise ExportError(f"{directory}: ps-{shard.shard_index} has no embedding table {name!r} (it has "
                              f"{', '.join(sorted(shard.tables)) or 'none'}): is it the module the job trained?")
        if table.spec.dim != dim:
            raise ExportError(f"{directory}: embedding table {name!r} has rows of {table.spec.dim} on the "
                              f"parameter servers, {dim} in this model")
        held = table.ids()
        if len(held) and held.max() >= rows:
            raise ExportError(f"{directory}: embedding table {name!r} holds row {int(held.max())} on "
                              f"ps-{shard.shard_index}, beyond this model's num_embeddings={rows}")
        mine = ids[owners == shard.shard_index]
        if len(mine):  # rows never pulled are created with the table's initializer, as a pull would
            weight[torch.from_numpy(mine)] = table.gather(mine).to(weight.dtype)
    return weight


__all__ = ["ExportError", "export_model", "load_shards"]
