"""Small models, data and a training loop shared by the accelerate tests (and their 2-process script)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset


class Block(nn.Module):
    """A residual MLP block that counts its forward calls (checkpointing runs it twice per step)."""

    calls = 0

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return x + torch.tanh(self.fc(x))


class BlockNet(nn.Module):
    def __init__(self, d_in: int = 16, width: int = 32, blocks: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = self.conv(x)
        return self.head(F.relu(self.seen).mean(dim=(2, 3)))


class NaiveSelfAttention(nn.Module):
    """Attention written out by hand: softmax(QK^T / sqrt(d)) V."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return tuple(t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(x)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(x.shape))


class SDPASelfAttention(NaiveSelfAttention):
    """The same attention through torch's fused scaled_dot_product_attention."""

    @classmethod
    def from_module(cls, module: NaiveSelfAttention) -> SDPASelfAttention:
        from flextrain.accelerate.methods.replace import adopt

        return adopt(cls, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(x)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape))


class AttnNet(nn.Module):
    """Sequence regression with nn.MultiheadAttention and a hand-written attention."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.naive = NaiveSelfAttention(dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, _ = self.mha(x, x, x)
        return self.head(self.naive(x + a).mean(dim=1))


def regression(n: int = 256, d: int = 16, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.tanh(x @ torch.randn(d, 1, generator=g)) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class DictData(Dataset):
    """Samples as dicts {"x": ..., "label": ...} (for model_input_format="unpack_dict")."""

    def __init__(self, base: TensorDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.base[i]
        return {"x": x, "label": y}


class DictModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, label: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(x)


def mse(batch, out):
    """ATorch's loss_func(input, output) for (x, y) batches."""
    return F.mse_loss(out.float(), batch[1].float())


class TupleModel(nn.Module):
    """Takes the whole (x, y) batch and uses x (model_input_format=None passes the batch as is)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, batch) -> torch.Tensor:
        return self.inner(batch[0])


def train(result, *, epochs: int = 2, fmt: str | None = None, device: str = "cpu", limit: int | None = None):
    """The user's ordinary loop over auto_accelerate's result; returns the per-step losses."""
    losses = []
    for _ in range(epochs):
        for i, batch in enumerate(result.dataloader):
            if limit is not None and i >= limit:
                break
            data = result.prepare_input(batch, device)
            out = result.model(**data) if fmt == "unpack_dict" else result.model(*data) if fmt == "unpack_sequence" \
                else result.model(data)
            loss = result.loss_func(data, out)
            loss = loss[0] if isinstance(loss, tuple) else loss
            loss.backward()
            result.optim.step()
            result.optim.zero_grad()
            losses.append(loss.item())
    return losses


class LoopLinear(nn.Linear):
    """A deliberately slow Linear: it multiplies sample by sample in a Python loop (the same outputs
    as ``nn.Linear``, to float rounding, many times slower on a batch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([F.linear(row, self.weight, self.bias) for row in x])


class FastLinear(LoopLinear):
    """LoopLinear's replacement (module_replace): one matrix product for the whole batch."""

    @classmethod
    def from_module(cls, module: LoopLinear) -> FastLinear:
        from flextrain.accelerate.methods.replace import adopt

        return adopt(cls, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def loop_net(d_in: int = 16, width: int = 64) -> nn.Module:
    """An MLP of LoopLinear layers: module_replace (with the pair of :func:`register_loop_pair`)
    makes it several times faster, on any machine."""
    return nn.Sequential(LoopLinear(d_in, width), nn.ReLU(), LoopLinear(width, width), nn.ReLU(),
                         LoopLinear(width, 1))


LOOP_PAIR = "test_LoopLinear_FastLinear"


def register_loop_pair() -> None:
    from flextrain.accelerate import register_replace_pair

    register_replace_pair(LOOP_PAIR, pair_cls=(LoopLinear, FastLinear))
