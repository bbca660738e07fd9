"""The float64 problem the rule-optimizer tests train, in-process and in 2 gloo processes.

``train`` is a script's loop over :class:`TraceBatchSampler` with a rule optimizer; ``reference``
takes one plain full-batch step per optimizer step of the same layout (the step's samples of the
epoch's order, mean loss, LR = base x the rule's factor). Run as a script it is one rank of a
2-process run (RANK/WORLD_SIZE/MASTER_* set by the test) and writes its parameters as JSON.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from flextrain.elastic.schedule import lr_factor
from flextrain.elastic.torch import AdaScaleOptimizer, LinearRuleOptimizer, SqrtRuleOptimizer, TraceBatchSampler

# 37 samples, minibatch 2: epoch 0 is steps 0-4 (36) and a partial step 5 of 1 sample (over 2 ranks,
# rank 1 has no share of it); epoch 1 starts at step 6 and ends with a partial step of 5.
SIZE, MINIBATCH, TRACE, REF, SEED, LR = 37, 2, [4, 8, 4, 12, 8, 8], 8, 7, 0.05
RULES = {"linear": LinearRuleOptimizer, "sqrt": SqrtRuleOptimizer, "adascale": AdaScaleOptimizer}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(SIZE, 5, generator=g, dtype=torch.float64)
    y = torch.randn(SIZE, 2, generator=g, dtype=torch.float64)
    return x, y


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()


def loss(net, x, y):
    return torch.nn.functional.mse_loss(net(x), y)


def setup(rule: str, world: int, rank: int):
    net = model()
    sampler = TraceBatchSampler(SIZE, TRACE, world, rank, minibatch_size=MINIBATCH, seed=SEED)
    opt = RULES[rule](torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9), sampler, ref_batchsize=REF)
    return net, sampler, opt


def run_epochs(net, sampler, opt, epochs, *, first=0, start=0, stop=None) -> None:
    """Epochs ``first..epochs-1`` as a script runs them; ``stop=(epoch, calls)`` returns early."""
    x, y = data()
    for epoch in range(first, epochs):
        sampler.set_epoch(epoch, start=start if epoch == first else 0)
        opt.set_epoch(epoch)
        for index in sampler:
            if stop == (epoch, opt.minibatch):
                return
            loss(net, x[index], y[index]).backward()
            opt.step()
            opt.zero_grad()  # a no-op, as a script would call it


def train(rule: str, world: int = 1, rank: int = 0, epochs: int = 2):
    net, sampler, opt = setup(rule, world, rank)
    run_epochs(net, sampler, opt, epochs)
    return net, opt


def reference(rule: str, epochs: int = 2) -> list[torch.Tensor]:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    x, y = data()
    layout = TraceBatchSampler(SIZE, TRACE, 1, 0, minibatch_size=MINIBATCH, seed=SEED)
    for epoch in range(epochs):
        layout.set_epoch(epoch)
        order = layout.order()
        for share in layout.shares():
            index = order[share.offset:share.offset + share.samples]
            opt.zero_grad()
            loss(net, x[index], y[index]).backward()
            opt.param_groups[0]["lr"] = LR * lr_factor(rule, share.samples, REF)
            opt.step()
    return [p.detach().clone() for p in net.parameters()]


if __name__ == "__main__":
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    net, opt = train(sys.argv[2], dist.get_world_size(), dist.get_rank())
    result = {"params": [p.detach().tolist() for p in net.parameters()], "real_steps": opt.real_steps,
              "gain": getattr(opt, "gain", None), "progress": getattr(opt, "progress", None)}
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate called
    # without an active exception', exit -6) after all the work is done, even for plain DDP scripts.
    os._exit(0)
