"""Synthetic regression data and the model the elastic examples share (so their results compare)."""

from __future__ import annotations

import argparse

import torch


def arguments(doc: str, *, scale_loss: bool = False) -> argparse.Namespace:
    """The flags every elastic example takes: G, M, the data size and the epochs (and --scale-loss
    where the example offers it)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    if scale_loss:
        p.add_argument("--scale-loss", action="store_true",
                       help="optimizer.scale(loss).backward(): the wrapper weights the loss, not the gradients")
    p.add_argument("--global-batch-size", type=int, default=256)
    p.add_argument("--max-micro-batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=3)
    return p.parse_args()


def dataset(samples: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(samples, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def loss_fn(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(prediction, target)  # the mean over the micro-batch
