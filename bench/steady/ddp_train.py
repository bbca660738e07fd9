"""The torchrun + DDP side of bench/ddp_steady.py: the same model, optimizer, loss and global batch.

Run as ``python -m torch.distributed.run --standalone --nproc-per-node N ddp_train.py --model
digits|wide --data data.pt``. One thread per process (as the flextrain workers), the records
decoded once up front (flextrain's workers read and ``feed`` theirs every step), the global
batch split over the ranks as evenly as flextrain's planner splits it, DDP's defaults (25 MB
buckets, gradients reduced during backward). Trains until it is killed; with
``BENCH_STEP_DIR`` every optimizer step appends ``time.perf_counter()`` to a file per process
(``digits_models.StampingSGD``, as the flextrain side).
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
import digits_models  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(digits_models.MODELS), required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.load(a.data)
    x, y = data["x"], data["y"]
    torch.manual_seed(0)
    model = digits_models.MODELS[a.model]()
    opt = digits_models.optimizer(model.parameters(), lr=a.lr)
    ddp = DDP(model)
    G = a.global_batch
    n = (x.shape[0] // G) * G
    per, extra = divmod(G, world)
    lo = rank * per + min(rank, extra)
    hi = lo + per + (1 if rank < extra else 0)
    step = 0
    while True:  # the bench kills it when it has what it needs
        base = (step * G) % n
        xb, yb = x[base + lo: base + hi], y[base + lo: base + hi]
        opt.zero_grad(set_to_none=True)
        digits_models.loss(yb, ddp(xb)).backward()
        opt.step()
        step += 1


if __name__ == "__main__":
    main()
