"""Models of every float dtype for tests/worker/test_dtypes.py, and one rank of a real
2-process gloo reduction (``python dtype_cases.py HOST PORT RANK OUT``).

Each rank plans the step like AllReduceTrainer (``plan_step``: G=10 over 2 ranks with
micro-batches of at most 3: 3+3 | 2+2, uneven), accumulates its micro-batches, reduces
every per-dtype buffer with the real Collective, applies, and writes what it saw.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from flextrain.elastic.planner import plan_step
from flextrain.worker.pytorch import TorchBackend

KINDS = ("float64", "bfloat16", "float16", "mixed")
G, M = 10, 3


class Net(nn.Module):
    """A small MLP in ``kind``'s dtype; ``mixed``: a float32 body and a float64 head."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.head = nn.Linear(8, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))  # integer state: never reduced
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)       # not trainable: never reduced
        if kind == "mixed":
            self.head.double()
        else:
            self.to(getattr(torch, kind))

    def forward(self, x):
        self.calls += 1
        h = self.body(x.to(self.body[0].weight.dtype))
        return self.head(h.to(self.head.weight.dtype))


def loss(labels, predictions):
    return nn.functional.mse_loss(predictions, labels.to(predictions.dtype))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(G, 6, generator=g), torch.randn(G, 2, generator=g)


def backend(kind: str, *, adam: bool = False) -> TorchBackend:
    model = Net(kind)
    params = model.parameters()
    opt = torch.optim.Adam(params, lr=0.01) if adam else torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return TorchBackend(model_def=SimpleNamespace(path=f"{kind}.py", loss=loss), model=model, optimizer=opt, extra=3)


def accumulate(b: TorchBackend, x, y, *, rank: int, world: int) -> None:
    """Rank's micro-batches of one step, each scaled by size/G (what AllReduceTrainer._compute does)."""
    plan = plan_step(G, world, M)
    for offset, size in plan.slices(rank):
        b.accumulate(x, y, slice(offset, offset + size), scale=size / G)


def main(host: str, port: int, rank: int, out: Path) -> None:
    from flextrain.elastic.statecodec import encode
    from flextrain.worker.collective import Collective

    collective = Collective(timeout=60)
    collective.join_round(host=host, port=port, round_id=0, rank=rank, world_size=2)
    x, y = data()
    result = {}
    for kind in KINDS:
        b = backend(kind)
        b.zero()
        accumulate(b, x, y, rank=rank, world=2)
        b.gathered()
        local = [t.clone() for t in b.buffers]
        b.slots[rank] = 1.0  # rank r raises flag r: both must see both
        collective.all_reduce_sum(b.buffers)
        b.apply()
        result[kind] = {"local": local, "reduced": [t.clone() for t in b.buffers], "model": b.model.state_dict()}
    collective.leave()
    out.write_bytes(encode(result))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    # Out without interpreter teardown: gloo's threads can race it and abort the process ("terminate
    # called without an active exception", seen once here) after all the results were written.
    os._exit(0)
