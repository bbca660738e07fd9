"""An adaptive global batch: G chosen each epoch from the gradient noise scale, the LR by AdaScale's gain.

    python examples/adaptive_batch.py
    torchrun --standalone --nproc-per-node 2 examples/adaptive_batch.py

Linear regression with label noise: far from the optimum the true gradient dominates (a small
noise scale σ²/μ², small batches are efficient); near it only the labels' noise is left (μ² -> 0,
the noise scale grows) and the sampler grows G, so later epochs take far fewer, larger steps.
The AdaScale optimizer measures σ² and μ² (all-reduced over the ranks) and scales the LR by its
gain; it hands its estimate to the sampler. Each rank prints one JSON line at the end: the
decisions (``history``), each epoch's G and loss, and the optimizer steps taken.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from flextrain.elastic.torch import AdaptiveBatchSampler, AdaScaleOptimizer


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--min-global-batch", type=int, default=16)
    p.add_argument("--max-global-batch", type=int, default=512)
    p.add_argument("--minibatch", type=int, default=8)
    p.add_argument("--every", type=int, default=None, help="decide every N steps (default: each epoch)")
    p.add_argument("--lr", type=float, default=0.005, help="the LR tuned for --min-global-batch")
    return p.parse_args()


def regression(samples: int, features: int = 16) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=g)
    y = x @ torch.randn(features, 1, generator=g) + torch.randn(samples, 1, generator=g)  # label noise 1
    return torch.utils.data.TensorDataset(x, y)


def main() -> dict:
    args = arguments()
    data = regression(args.samples)
    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Linear(data.tensors[0].shape[1], 1)
    sampler = AdaptiveBatchSampler(len(data), min_global_batch=args.min_global_batch,
                                   max_global_batch=args.max_global_batch, minibatch_size=args.minibatch,
                                   every=args.every)  # the world: the process group, else one process
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)  # num_workers=0: decisions mid-epoch work
    # ref_batchsize = the smallest G: the LR was tuned for it, AdaScale's gain is measured against it
    optimizer = AdaScaleOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr), sampler,
                                  args.min_global_batch, smoothing=0.9)
    x, y = data.tensors
    epochs = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for xb, yb in loader:
            (0.5 * (model(xb) - yb).pow(2).mean()).backward()  # the mean over the minibatch
            optimizer.step()  # accumulates, or all-reduces, measures the noise and steps
        with torch.no_grad():
            loss = float(0.5 * (model(x) - y).pow(2).mean())
        epochs.append({"global_batch": sampler.global_batch(sampler.first_step(epoch)), "loss": loss,
                       "noise_scale": sampler.noise.noise_scale})
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    return {"rank": sampler.rank, "world_size": sampler.num_replicas, "history": sampler.history, "epochs": epochs,
            "steps": optimizer.real_steps, "gain": optimizer.gain, "lr": optimizer.last_lr, "checksum": checksum}


if __name__ == "__main__":
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    result = main()
    os.write(1, (json.dumps(result) + "\n").encode())  # one write(2) per rank (< PIPE_BUF): lines never interleave
    if dist.is_initialized():
        dist.destroy_process_group()
    # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate called
    # without an active exception', exit -6) after all the work is done, even for plain DDP scripts.
        os._exit(0)
