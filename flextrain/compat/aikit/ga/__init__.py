"""``aikit.ga``: gradient-accumulation optimizers (``ga.Torch.optim.Optimizer``)."""

from flextrain.compat.aikit.ga import Torch

__all__ = ["Torch"]
