"""The small float64 model and data the GA tests train, shared by in-process and multi-process tests."""

from __future__ import annotations

import torch


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()


def data(samples: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 6, generator=g, dtype=torch.float64)
    y = torch.randn(samples, 3, generator=g, dtype=torch.float64)
    return x, y


def loss(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(net(x), y)  # the mean over the samples given


def full_batch_reference(G: int, real_steps: int, make_optimizer) -> list[torch.Tensor]:
    """Parameters after ``real_steps`` plain full-batch steps over consecutive global batches of G."""
    net = model()
    opt = make_optimizer(net.parameters())
    x, y = data(G * real_steps)
    for t in range(real_steps):
        opt.zero_grad()
        loss(net, x[t * G:(t + 1) * G], y[t * G:(t + 1) * G]).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]
