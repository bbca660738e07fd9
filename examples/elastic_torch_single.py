"""Elastic PyTorch in one process: init(G, M) plans gradient accumulation, the wrapper applies it.

    python examples/elastic_torch_single.py --global-batch-size 256 --max-micro-batch 64 [--scale-loss]

Each optimizer step sees the whole global batch G; one device holds at most M samples, so the
step is accumulated over ``elastic.steps`` micro-batches of ``elastic.batch_sizes`` (exact also
when G does not split evenly, e.g. G=250: 63, 63, 62, 62). With --scale-loss the script calls
``optimizer.scale(loss).backward()``: the same training, with the weight on the scalar loss instead
of a pass over the gradients. Prints one JSON line at the end.
"""

from __future__ import annotations

import json
import logging

import torch

import flextrain.elastic.torch as elastic
from _synthetic import arguments, dataset, loss_fn, model


def main() -> None:
    args = arguments(__doc__, scale_loss=True)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # shows init's one-line plan

    elastic.init(args.global_batch_size, max_micro_batch=args.max_micro_batch)
    net = model()
    optimizer = elastic.Optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    # The loader yields whole global batches; each is cut into this process's micro-batches.
    loader = torch.utils.data.DataLoader(dataset(args.samples), batch_size=args.global_batch_size,
                                         shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(1))
    losses = []
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            for xm, ym in zip(x.split(elastic.batch_sizes), y.split(elastic.batch_sizes)):
                loss = loss_fn(net(xm), ym)
                (optimizer.scale(loss) if args.scale_loss else loss).backward()
                optimizer.step()       # the real step on every elastic.steps-th call
                optimizer.zero_grad()  # a no-op between micro-steps
                total += loss.item() * len(xm)
            if optimizer.stepped:
                scheduler.step()       # once per real update
        losses.append(total / (len(loader) * args.global_batch_size))
        logging.info("epoch %d: loss %.5f", epoch, losses[-1])
    checksum = sum(p.detach().double().sum().item() for p in net.parameters())
    print(json.dumps({"steps": elastic.steps, "batch_sizes": list(elastic.batch_sizes),
                      "real_steps": optimizer.real_steps, "losses": losses,
                      "lr": optimizer.param_groups[0]["lr"], "checksum": checksum}))


if __name__ == "__main__":
    main()
