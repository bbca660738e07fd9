"""A plain PyTorch loop as a process of its own: a side of ``bench/overhead.py``'s interleaved method.

Every side of that method is a process that the bench stops (SIGSTOP) outside its windows,
so all of them pay the same for being paused and resumed (cold caches, sleeping threads);
an in-process baseline paid nothing for it and flattered itself by up to ~4% (the earlier
A/A check, see bench/README.md).

Usage (by the bench): ``plain_loop.py --mode memory|stream|checked --batch G --ready PATH --out PATH FILE...``.
Builds the loop of ``overhead_sides.PlainLoop``, runs one unmeasured pass over the data
(every chunk decoded once), creates ``--ready``, then steps until SIGTERM and writes
``{"times": [...], "samples": [...], "mean_loss": x}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch

from overhead_sides import PlainLoop, load_module

MODES = ("memory", "stream", "checked")  # checked: stream + the gradient check of a flextrain step


def warmed_up(files: list[str], mode: str, *, batch: int, seed: int, lr: float | None) -> PlainLoop:
    """A loop after one pass over the data, with its step clock cleared."""
    from flextrain.data import open_reader

    loop = PlainLoop(load_module(), files, batch=batch, seed=seed, lr=lr, stream=mode != "memory",
                     check=mode == "checked")
    for _ in range(sum(-(-len(open_reader(f)) // batch) for f in files)):
        loop.step()
    loop.series.times.clear()
    loop.series.samples.clear()
    loop.loss_sum = 0.0
    return loop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    p.add_argument("--ready", required=True, help="created once warmed up")
    p.add_argument("--out", required=True, help="step clock written here on SIGTERM")
    p.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # finish the step, then write
    loop = warmed_up(args.files, args.mode, batch=args.batch, seed=args.seed, lr=args.lr)
    Path(args.ready).touch()
    while not stop:
        loop.step()
    Path(args.out).write_text(json.dumps({"times": loop.series.times, "samples": loop.series.samples,
                                          "mean_loss": loop.mean_loss}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
