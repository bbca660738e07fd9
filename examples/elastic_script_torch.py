"""An elastic PyTorch training script for ``flextrain run`` (docs/script-jobs.md).

    flextrain run --workers 2 --min-workers 1 --max-workers 4 examples/elastic_script_torch.py --steps 200

A tiny linear model on synthetic data, trained with DDP over gloo. The global
batch ``G`` stays fixed whatever the world: ``flextrain.elastic.torch.init(G, M)``
reads the world the job started this process in and says how many
accumulation steps of which batch sizes this rank takes; the GA optimizer
applies one real update per global batch. The script commits its state every
``--commit-every`` steps, so a re-formed world continues from the last commit,
never from 0.

Each start appends one JSON line to ``$FLEXTRAIN_JOB_DIR/script-log.jsonl``
(``round``, ``world_size``, ``rank``, the ``step`` it restored, ``batch_size``,
``steps``, ``G``), and rank 0 appends one per commit, so tests can check that
G stayed fixed and the committed step was restored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import flextrain.elastic.torch as elastic


def log(path: Path, **record) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps in all")
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--max-micro-batch", type=int, default=16)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pause per step (tests: time to act)")
    parser.add_argument("--fail-at-step", type=int, default=-1, help="raise at this step (tests)")
    args = parser.parse_args()

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")  # MASTER_ADDR/MASTER_PORT: the round's store
    plan = elastic.init(args.global_batch_size, max_micro_batch=args.max_micro_batch)
    world, rank, steps, batch = elastic.world_size, elastic.rank, elastic.steps, elastic.batch_size
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    state = elastic.State(model=model, optimizer=inner, step=0)
    restored = state.restore()
    net = DistributedDataParallel(model) if world > 1 else model
    optimizer = elastic.Optimizer(inner)  # one real update per global batch, the mean over G
    job_dir = Path(os.environ.get("FLEXTRAIN_JOB_DIR", "."))
    records = job_dir / "script-log.jsonl"
    log(records, event="start", round=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), world_size=world,
        rank=rank, step=state.step, restored=restored, batch_size=batch, steps=steps, G=args.global_batch_size,
        pid=os.getpid(), time=time.time())
    true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    while state.step < args.steps:
        if state.step == args.fail_at_step:
            raise ValueError(f"failing on purpose at step {state.step}")
        gen = torch.Generator().manual_seed(state.step * 1000 + rank)
        for size in plan.batch_sizes:  # this rank's micro-batches of one global batch (exact if uneven)
            x = torch.randn(size, 8, generator=gen)
            with optimizer.sync_context(net):  # DDP all-reduces only on the last micro-step
                loss = torch.nn.functional.mse_loss(net(x), x @ true_w)
                loss.backward()
            elastic.report_loss(loss)  # the job's history: the real step below reports the mean (in a job)
            optimizer.step()
            optimizer.zero_grad()
        assert optimizer.stepped
        state.step += 1
        if state.step % args.commit_every == 0 or state.step == args.steps:
            state.commit()
            if rank == 0:
                log(records, event="commit", step=state.step, world_size=world, loss=float(loss.detach()),
                    time=time.time())
        if args.step_seconds:
            time.sleep(args.step_seconds)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
