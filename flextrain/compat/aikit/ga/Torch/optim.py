"""``aikit.ga.Torch.optim.Optimizer(optimizer, steps)``: :class:`flextrain.elastic.torch.Optimizer`."""

from __future__ import annotations

import torch

from flextrain.elastic import torch as elastic_torch


def Optimizer(optimizer: torch.optim.Optimizer, steps: int | None = None, *,  # noqa: N802 (AIkit's name)
              reduction: str = "sum") -> elastic_torch.Optimizer:
    """Wrap ``optimizer`` with gradient accumulation over ``steps`` micro-steps.

    ``reduction="sum"`` by default, as AIkit's optimizer did: the applied gradient is the sum of
    the micro-steps' gradients, so a ported script trains as before. ``reduction="mean"`` applies
    the mean over the global batch (exact for uneven splits), flextrain's default.
    """
    return elastic_torch.Optimizer(optimizer, steps, reduction=reduction)


__all__ = ["Optimizer"]
