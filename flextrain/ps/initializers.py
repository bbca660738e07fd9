"""Deterministic initial values for embedding rows.

A row's initial value depends only on ``(seed, table name, id)`` (and the
column), never on which PS holds it, when it is first pulled, what else was
pulled with it, or how often the PS restarted. That is what lets rows be
created lazily on any shard and still give reproducible training.

Each element is a counter-based hash (splitmix64 over seed, table, id and
column) turned into a uniform number, then mapped by the inverse CDF. All of
it is vectorised over the batch of new rows (no per-row RNG objects).
"""

from __future__ import annotations

import math
import zlib
from typing import Mapping

import numpy as np
import torch

from flextrain.protocol.shard import mix64_array

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

# name -> (argument defaults); the table spec's init_args override them.
INITIALIZERS: dict[str, dict[str, float]] = {
    "normal": {"mean": 0.0, "std": 1.0},            # torch.nn.Embedding's default
    "truncated_normal": {"mean": 0.0, "std": 1.0},  # cut at mean +- 2 std
    "uniform": {"low": -0.05, "high": 0.05},
    "zeros": {},
    "constant": {"value": 0.0},
}


def check_initializer(table: str, name: str, args: Mapping[str, float]) -> dict[str, float]:
    """Resolved arguments of initializer ``name``; ValueError naming the table otherwise."""
    defaults = INITIALIZERS.get(name)
    if defaults is None:
        raise ValueError(f"embedding table {table!r}: unknown initializer {name!r}; "
                         f"known: {', '.join(sorted(INITIALIZERS))}")
    unknown = sorted(set(args) - set(defaults))
    if unknown:
        raise ValueError(f"embedding table {table!r}: initializer {name!r} takes "
                         f"{', '.join(sorted(defaults)) or 'no arguments'}, not {', '.join(unknown)}")
    resolved = {**defaults, **{k: float(v) for k, v in args.items()}}
    if resolved.get("std", 1.0) < 0 or resolved.get("low", 0.0) > resolved.get("high", 0.0):
        raise ValueError(f"embedding table {table!r}: bad initializer arguments {resolved}")
    return resolved


def _uniform01(seed: int, table: str, ids: np.ndarray, dim: int) -> np.ndarray:
    """Open-interval (0, 1) uniforms, shape [len(ids), dim], float64."""
    key = mix64_array(np.array([(seed & ((1 << 64) - 1)) ^ (zlib.crc32(table.encode()) << 32)], dtype=np.uint64))
    per_row = mix64_array(ids.astype(np.int64).view(np.uint64) ^ key)          # [n]
    cols = np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN                     # [dim]
    bits = mix64_array(per_row[:, None] + cols[None, :])                        # [n, dim]
    # 53 random bits -> (0, 1); the half-ulp offset keeps 0 out (inverse CDFs diverge there).
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


def initial_rows(*, table: str, seed: int, initializer: str, args: Mapping[str, float],
                 ids: np.ndarray, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Initial rows for ``ids`` (int64), shape ``[len(ids), dim]``, in ``dtype``."""
    n = len(ids)
    if initializer == "zeros":
        return torch.zeros((n, dim), dtype=dtype)
    if initializer == "constant":
        return torch.full((n, dim), args["value"], dtype=dtype)
    u = torch.from_numpy(_uniform01(seed, table, ids, dim))
    if initializer == "uniform":
        out = u * (args["high"] - args["low"]) + args["low"]
    elif initializer == "normal":
        out = torch.erfinv(u * 2 - 1) * (math.sqrt(2.0) * args["std"]) + args["mean"]
    elif initializer == "truncated_normal":
        # Inverse CDF restricted to [Phi(-2), Phi(2)]: exactly the truncated distribution, no resampling.
        lo, hi = 0.5 * (1 + math.erf(-2 / math.sqrt(2))), 0.5 * (1 + math.erf(2 / math.sqrt(2)))
        out = torch.erfinv((lo + u * (hi - lo)) * 2 - 1) * (math.sqrt(2.0) * args["std"]) + args["mean"]
    else:
        raise ValueError(f"embedding table {table!r}: unknown initializer {initializer!r}")
    return out.to(dtype)
