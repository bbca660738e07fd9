"""Elastic PyTorch with DDP: the same global batch and results as in one process, over N processes.

    torchrun --standalone --nproc-per-node 2 examples/elastic_torch_ddp.py --global-batch-size 256 --max-micro-batch 64

init(G, M) reads the process group: with 2 processes, G=256, M=64 gives 2 accumulation steps of
64 per process (1 process: 4 steps). Every process reads the same global batches and takes its
own span of each (``session.plan.span(rank)``), cut into ``elastic.batch_sizes``; ``no_sync``
skips DDP's all-reduce until the last micro-step. Each rank prints one JSON line.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import flextrain.elastic.torch as elastic
from _synthetic import arguments, dataset, loss_fn, model


def main() -> None:
    args = arguments(__doc__)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    dist.init_process_group("gloo")  # torchrun's MASTER_ADDR/PORT, RANK, WORLD_SIZE
    session = elastic.init(args.global_batch_size, max_micro_batch=args.max_micro_batch)
    net = DistributedDataParallel(model())
    optimizer = elastic.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    loader = torch.utils.data.DataLoader(dataset(args.samples), batch_size=args.global_batch_size,
                                         shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(1))  # same order on every rank
    start, end = session.plan.span(elastic.rank)
    losses = []
    for epoch in range(args.epochs):
        total = torch.zeros(())
        for x, y in loader:
            mine = zip(x[start:end].split(elastic.batch_sizes), y[start:end].split(elastic.batch_sizes))
            for xm, ym in mine:
                with elastic.no_sync(net, optimizer):  # no all-reduce before the last micro-step
                    loss = loss_fn(net(xm), ym)
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                total += loss.detach() * len(xm)
            if optimizer.stepped:
                scheduler.step()
        dist.all_reduce(total)  # every rank's samples: the epoch's mean loss over all of them
        losses.append(total.item() / (len(loader) * args.global_batch_size))
        if elastic.master:
            logging.info("epoch %d: loss %.5f", epoch, losses[-1])
    checksum = sum(p.detach().double().sum().item() for p in net.module.parameters())
    line = json.dumps({"rank": elastic.rank, "world_size": elastic.world_size, "steps": elastic.steps,
                       "batch_sizes": list(elastic.batch_sizes), "real_steps": optimizer.real_steps,
                       "losses": losses, "checksum": checksum}) + "\n"
    os.write(sys.stdout.fileno(), line.encode())  # one write: ranks share torchrun's stdout, lines must not mix
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate called
    # without an active exception', exit -6) after all the work is done, even for plain DDP scripts.
    sys.stdout.flush()
    os._exit(0)
