"""The GA wrapper (``flextrain.elastic.torch.Optimizer``) vs hand-written gradient accumulation.

    .venv/bin/python bench/ga_wrapper.py                 # ~6 min on the 2-core machine
    .venv/bin/python bench/ga_wrapper.py --rounds 4      # smoke test

Two models, SGD with momentum, float32, in-memory data, one process:

* **cnn** (the target): a small conv net on 3×32×32 images (3 convolutions 32/64/128, pooling, a
  linear head; 95k parameters) -- the shape of model people accumulate gradients for, whose
  micro-batch is bounded by its activations;
* **mlp** (the worst case): 256-1024-1024-10 (1.3M parameters) on 64-sample micro-batches, about
  400 flops per parameter per micro-step, so a pass over the gradients weighs as much as it can.

Three loops train each model on the same data:

* **hand**: the usual hand-written loop: ``(loss * n/G).backward()`` per micro-batch of n, and
  ``step(); zero_grad()`` every ``steps`` micro-batches;
* **wrapper**: ``loss.backward(); optimizer.step(); optimizer.zero_grad()`` every micro-batch,
  with the wrapper over the same kind of optimizer;
* **scaled**: the wrapper with the opt-in ``optimizer.scale(loss).backward()`` (the weight lands
  on the scalar loss, no pass over the gradients);
* **control**: a second copy of the hand loop (an A/A check of the method: 1.0 if fair).

With ``--threads 1`` (the default) steps are timed in this thread's CPU time
(``time.thread_time``: every kernel runs on it, and time other processes take from a shared
machine does not count); with more threads, in wall time. Speed still drifts, so the sides take turns in short blocks (``--block`` real steps
each, the order rotated every round) and each wrapper or control block is divided by the mean of
the hand blocks just before and after it. Reported per case (model × even: G=256, M=64, 4
micro-steps; uneven: G=250, 63/63/62/62): the median of those paired ratios with a 95% bootstrap
interval, and each side's real steps per second. ``met``: the wrapper reaches ``TARGET`` in both
cnn cases and with ``scale`` in every case. One JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flextrain.elastic.torch as elastic  # noqa: E402

TARGET = 0.98


def mlp(args) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU(),
                               torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                               torch.nn.Linear(args.hidden, args.classes))


def cnn(args) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for c_in, c_out in ((3, 32), (32, 64)):
        layers += [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
    return torch.nn.Sequential(*layers, torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, args.classes))


MODELS = {"cnn": (cnn, lambda args: (3, 32, 32)), "mlp": (mlp, lambda args: (args.features,))}


def sgd(net: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)


def hand_loop(net, x, y, sizes: tuple[int, ...]) -> Callable[[], None]:
    """One real step of hand-written accumulation over micro-batches of ``sizes``."""
    opt, G = sgd(net), sum(sizes)
    weights = [n / G for n in sizes]

    def real_step() -> None:
        offset = 0
        for n, w in zip(sizes, weights):
            (torch.nn.functional.cross_entropy(net(x[offset:offset + n]), y[offset:offset + n]) * w).backward()
            offset += n
        opt.step()
        opt.zero_grad()
    return real_step


def wrapper_loop(net, x, y, sizes: tuple[int, ...], *, scaled: bool = False) -> Callable[[], None]:
    """One real step through the wrapper: the script calls step/zero_grad every micro-batch."""
    opt = elastic.Optimizer(sgd(net))
    assert opt.steps == len(sizes)

    def real_step() -> None:
        offset = 0
        for n in sizes:
            loss = torch.nn.functional.cross_entropy(net(x[offset:offset + n]), y[offset:offset + n])
            (opt.scale(loss) if scaled else loss).backward()
            offset += n
            opt.step()
            opt.zero_grad()
        assert opt.stepped
    return real_step


def timed(step: Callable[[], None], block: int, clock: Callable[[], float]) -> float:
    """Real steps per second of ``clock`` over one block."""
    start = clock()
    for _ in range(block):
        step()
    return block / (clock() - start)


def bootstrap(ratios: list[float], *, seed: int = 0, resamples: int = 2000) -> list[float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return [medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]]


def paired_ratios(series: list[tuple[str, float]], side: str) -> list[float]:
    """Each ``side`` block over the mean of the nearest hand blocks before and after it."""
    ratios = []
    for i, (name, rate) in enumerate(series):
        if name != side:
            continue
        before = next((r for n, r in reversed(series[:i]) if n == "hand"), None)
        after = next((r for n, r in series[i + 1:] if n == "hand"), None)
        near = [r for r in (before, after) if r is not None]
        if near:
            ratios.append(rate / statistics.fmean(near))
    return ratios


def run_case(model: str, G: int, M: int, args) -> dict:
    session = elastic.init(G, max_micro_batch=M)  # one process: steps = ceil(G/M)
    sizes = session.batch_sizes
    build, shape = MODELS[model]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(G, *shape(args), generator=g)
    y = torch.randint(0, args.classes, (G,), generator=g)
    sides = {"hand": hand_loop(build(args), x, y, sizes),
             "wrapper": wrapper_loop(build(args), x, y, sizes),
             "scaled": wrapper_loop(build(args), x, y, sizes, scaled=True),
             "control": hand_loop(build(args), x, y, sizes)}
    # With one torch thread every kernel runs on this thread, so its CPU time is the step's work
    # and excludes time stolen by other processes on a shared machine; else wall time.
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    for step in sides.values():  # warm-up: allocator, momentum buffers, threads
        timed(step, 2, clock)
    order, series = list(sides), []
    for r in range(args.rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            series.append((name, timed(sides[name], args.block, clock)))
        print(f"{model} G={G}: round {r + 1}/{args.rounds}", file=sys.stderr)
    out = {"model": model, "parameters": sum(p.numel() for p in build(args).parameters()), "global_batch": G, "max_micro_batch": M, "micro_batches": list(sizes), "even": session.even,
           "clock": clock.__name__}
    for side in ("wrapper", "scaled", "control"):
        ratios = paired_ratios(series, side)
        out[f"{side}_vs_hand"] = round(statistics.median(ratios), 4)
        out[f"{side}_vs_hand_ci95"] = [round(v, 4) for v in bootstrap(ratios)]
    for side in sides:
        out[f"{side}_steps_per_s"] = round(statistics.median(rate for n, rate in series if n == side), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="turns of each side per case")
    p.add_argument("--block", type=int, default=4, help="real steps per turn")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: least noise on a shared machine)")
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["cnn", "mlp"])
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = {f"{model}-{kind}": run_case(model, G, 64, args)
             for model in args.models for kind, G in (("even", 256), ("uneven", 250))}
    target_cases = [c for c in cases if c.startswith("cnn-")] or list(cases)
    result = {
        "bench": "ga_wrapper",
        "method": "interleaved blocks in one process; ratio = wrapper real steps/s over the mean of the "
                  "neighbouring hand-written blocks; median of paired ratios, 95% bootstrap interval",
        "torch": torch.__version__, "threads": args.threads, "rounds": args.rounds, "block": args.block,
        "cases": cases, "target": TARGET, "target_cases": target_cases,
        "met": all(cases[c]["wrapper_vs_hand"] >= TARGET for c in target_cases)
               and all(case["scaled_vs_hand"] >= TARGET for case in cases.values()),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
