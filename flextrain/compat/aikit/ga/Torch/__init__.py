"""``aikit.ga.Torch``: ``optim.Optimizer(optimizer, steps)``."""

from flextrain.compat.aikit.ga.Torch import optim

__all__ = ["optim"]
