"""auto_accelerate's fully automatic mode: it finds the strategy for a small conv net by dry runs.

No strategy is given (``load_strategy=None``): auto_accelerate dry-runs the plain model and every
method (and combination) that applies here on a few batches of the data, rejects any that fails
or changes the loss, prints the table of candidates (``verbose=True``), applies the fastest and
saves it; the ordinary loop then trains with what it returns.

    python examples/accelerate_auto.py                             # the search, then 2 epochs
    python examples/accelerate_auto.py --time_limit 20 --excluded native_dynamo
    python examples/accelerate_auto.py --load_strategy_file auto_strategy.json   # reuse the pick
    torchrun --nproc_per_node 2 examples/accelerate_auto.py --excluded native_dynamo

On a CPU with bf16 support, channels_last + amp_native(bf16) is usually about twice the plain
speed for this net; on another machine the search may well pick something else. Prints one
JSON line (rank 0) with the pick, the search's figures and the losses (a test reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from flextrain.accelerate import auto_accelerate


class DemoCNN(nn.Module):
    """Three 3x3 convolutions (32/64/128 channels), pooling and a linear head, for 3x32x32 images."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, c_out in ((3, 32), (32, 64)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        self.net = nn.Sequential(*layers, nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(128, classes))

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(images)


class Images(Dataset):
    """Noisy images whose class is a colour pattern (learnable in a few steps), as dicts."""

    def __init__(self, size: int, classes: int = 10) -> None:
        g = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, classes, (size,), generator=g)
        patterns = torch.randn(classes, 3, 1, 1, generator=g)
        self.images = patterns[self.labels] + 0.5 * torch.randn(size, 3, 32, 32, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"images": self.images[i], "labels": self.labels[i]}


def loss_func(batch: dict[str, torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float(), batch["labels"])


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasize", type=int, default=1024)
    p.add_argument("--epoch", type=int, default=2)
    p.add_argument("--batchsize", type=int, default=64, help="the global batch")
    p.add_argument("--time_limit", type=float, default=None, help="seconds for the search (default 300)")
    p.add_argument("--excluded", nargs="*", default=None, help="methods the search must not use")
    p.add_argument("--included", nargs="*", default=None, help="methods every candidate must have")
    p.add_argument("--load_strategy_file", help="skip the search: apply a strategy saved as JSON")
    p.add_argument("--save_strategy_to_file", default="auto_strategy.json", help="where the pick is saved")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    status, res, best_strategy = auto_accelerate(
        DemoCNN(),
        optim_func=torch.optim.SGD,
        dataset=Images(args.datasize),
        loss_func=loss_func,
        model_input_format="unpack_dict",  # model(**batch)
        optim_args={"lr": 0.05, "momentum": 0.9},
        dataloader_args={"batch_size": args.batchsize, "shuffle": True},
        load_strategy=args.load_strategy_file,  # None: the fully automatic mode
        excluded=args.excluded,
        included=args.included,
        time_limit=args.time_limit,
        verbose=True,
        save_strategy_to_file=args.save_strategy_to_file,
    )
    assert status, "auto_accelerate found no strategy that runs"
    model, optim, dataloader, loss_func_, prepare_input = res.model, res.optim, res.dataloader, res.loss_func, \
        res.prepare_input

    losses = []
    for epoch in range(args.epoch):
        if hasattr(dataloader.sampler, "set_epoch"):
            dataloader.sampler.set_epoch(epoch)
        for batch in dataloader:
            optim.zero_grad()
            batch = prepare_input(batch, device)
            loss = loss_func_(batch, model(**batch))
            loss.backward()
            optim.step()
            losses.append(loss.item())

    if not dist.is_initialized() or dist.get_rank() == 0:
        search = res.args.search
        print(json.dumps({
            "strategy": list(best_strategy.names),
            "search": None if search is None else {"elapsed": search.elapsed, "time_limit": search.time_limit,
                                                   "stopped_early": search.stopped_early, "rows": search.rows()},
            "loader_batch": dataloader.batch_size, "steps": len(losses), "first_loss": losses[0],
            "last_loss": losses[-1]}))
    if dist.is_initialized():
        dist.destroy_process_group()
        # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate
        # called without an active exception', exit -6) after all the work is done.
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
