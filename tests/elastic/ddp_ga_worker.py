"""One rank of the 2-process GA tests (started by test_torch_ddp.py with RANK/WORLD_SIZE/MASTER_*).

Forms a gloo group, then calls ``init`` with the launcher's variables removed (so the plan must
come from the process group), trains ``real_steps`` steps of the global batch G through DDP and
the GA wrapper with ``no_sync`` (weighting the gradients, or with argv[5] == "loss" the losses
through ``optimizer.scale``), counting the all-reduces DDP makes at each micro-step, and
writes its plan, the counts and the final parameters as JSON to argv[1].
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

import flextrain.elastic.torch as elastic
from ga_model import data, loss, model


def main(out: str, G: int, M: int, real_steps: int, weigh: str = "grads") -> None:
    dist.init_process_group("gloo", init_method="env://")
    for var in ("WORLD_SIZE", "RANK"):
        del os.environ[var]
    s = elastic.init(G, M)
    net = DistributedDataParallel(model())
    reduces = [0]

    def counting_hook(state, bucket):
        reduces[0] += 1
        return allreduce_hook(state, bucket)

    net.register_comm_hook(None, counting_hook)
    opt = elastic.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    x, y = data(G * real_steps)
    start, _ = s.plan.span(s.rank)  # this rank's share of every global batch
    per_micro_step = []
    for t in range(real_steps):
        offset = t * G + start
        for n in s.batch_sizes:
            before = reduces[0]
            boundary = opt.is_boundary
            with opt.sync_context(net):
                micro_loss = loss(net, x[offset:offset + n], y[offset:offset + n])
                (opt.scale(micro_loss) if weigh == "loss" else micro_loss).backward()
            offset += n
            opt.step()
            opt.zero_grad()
            per_micro_step.append([boundary, reduces[0] - before])
    result = {"source": s.world.source.value, "steps": s.steps, "batch_sizes": list(s.batch_sizes),
              "rank": s.rank, "world_size": elastic.world_size, "real_steps": opt.real_steps,
              "reduces": per_micro_step,
              "params": [p.detach().tolist() for p in net.module.parameters()]}
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
    # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate called
    # without an active exception', exit -6) after all the work is done, even for plain DDP scripts.
    os._exit(0)
