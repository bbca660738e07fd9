"""InfinityBatch's mechanisms vs a plain loop at the largest batch that fits a memory limit.

    .venv/bin/python bench/infinity_batch.py              # ~3 min on the 2-core machine
    .venv/bin/python bench/infinity_batch.py --rounds 2   # smoke test

The demo CNN (three 3×3 convolutions, 32/64/128 channels, pooling, a linear head; 3×32×32
inputs, 10 classes), SGD with momentum, float32, one torch thread. First the micro-batch probe
(:mod:`flextrain.elastic.probe`) finds ``P``, the largest batch whose training step fits
``--memory-limit`` (default: the measured peak of a step of ``--fit`` samples). Then, on the
same in-memory data, in turns (rounds of one block each, the order rotated), samples per
second of thread CPU time of:

* **plain**: a hand-written loop at batch ``P`` (the most a plain loop can do under the limit);
* **accumulate**: ``ib.epoch()`` over logical batches of ``--factor``×P, its micro-batch size
  probed under the same limit (``max_micro_batch="auto"``: a little under P, since accumulating
  holds a micro-batch's gradients beside the sums);
* **recompute**: infinitybatch's custom loop (``outputs = ib.batch_(); loss.backward(); ...``)
  over the same logical batches, micro-batches probed likewise, checkpointed and recomputed;
* **offload**: the custom loop with ``mechanism="offload"``: one forward of the whole logical
  batch with saved activations in host memory (on a CPU device a plain forward, so its peak is
  the whole batch's -- reported, it does not fit the limit here; on a GPU it bounds device memory).

Each side's block is divided by the mean of the plain blocks beside it; reported per side: the
median of those ratios with a 95% bootstrap interval, and the measured peak of one of its steps
against the limit. One JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ga_wrapper import bootstrap, paired_ratios  # noqa: E402

from flextrain.elastic.infinity import InfinityBatch  # noqa: E402
from flextrain.elastic.memory import static_bytes, step_peak  # noqa: E402
from flextrain.elastic.probe import probe_micro_batch, training_step  # noqa: E402


def demo_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for c_in, c_out in ((3, 32), (32, 64)):
        layers += [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
    return torch.nn.Sequential(*layers, torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10))


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def one_epoch(ib: InfinityBatch, custom: bool) -> None:
    """``ib.epoch()``, or infinitybatch's custom loop over ``ib.dataloader``."""
    if not custom:
        ib.epoch()
        return
    for _, targets in ib.dataloader:
        ib.criterion(ib.batch_(), targets).backward()
        ib.step()
        ib.zero_grad()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fit", type=int, default=128, help="the default limit is the peak of a step of this many")
    p.add_argument("--memory-limit", type=int, help="bytes (default: see --fit)")
    p.add_argument("--factor", type=int, default=4, help="logical batch = factor x the largest that fits")
    p.add_argument("--batches", type=int, default=2, help="logical batches per block")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    criterion = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    n_max = args.fit * args.factor * 2
    x, y = torch.randn(n_max, 3, 32, 32, generator=g), torch.randint(0, 10, (n_max,), generator=g)

    probe_model = demo_cnn()
    probe_opt = sgd(probe_model)
    step = training_step(probe_model, probe_opt, criterion, lambda m: (x[:m], y[:m]))
    base = static_bytes(probe_model, probe_opt)
    limit = args.memory_limit or step_peak(lambda: step(args.fit), baseline=base).peak_bytes
    found = probe_micro_batch(step, limit=limit, upper=n_max)
    P = found.size
    print(f"largest batch that fits {limit} bytes: {P} (probed in {found.seconds:.1f}s)", file=sys.stderr)
    logical = P * args.factor
    batches = [(x[i * logical % n_max:][:logical], y[i * logical % n_max:][:logical]) for i in range(args.batches)]

    plain_model, ibs = demo_cnn(), {}
    plain_opt = sgd(plain_model)

    def plain() -> int:
        for lx, ly in batches:
            for s in range(0, logical, P):
                plain_opt.zero_grad()
                criterion(plain_model(lx[s:s + P]), ly[s:s + P]).backward()
                plain_opt.step()
        return logical * len(batches)

    def ib_side(mechanism: str, custom: bool):
        model = demo_cnn()
        ib = InfinityBatch(max_micro_batch="auto", memory_limit=limit, model=model, optimizer=sgd(model),
                           criterion=criterion, dataloader=batches, mechanism=mechanism)
        ibs[mechanism] = ib

        def run() -> int:
            one_epoch(ib, custom)
            return logical * len(batches)
        return run

    sides = {"plain": plain, "accumulate": ib_side("accumulate", False), "recompute": ib_side("recompute", True),
             "offload": ib_side("offload", True)}
    for run in sides.values():  # warm-up
        run()
    order, series = list(sides), []
    for r in range(args.rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            start = time.thread_time()
            samples = sides[name]()
            series.append((name, samples / (time.thread_time() - start)))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)

    def peak_of(name: str) -> int:
        if name == "plain":
            return step_peak(lambda: step(P), baseline=base).peak_bytes
        ib = ibs[name]
        one = [batches[0]]

        def go() -> None:
            ib.dataloader = one
            one_epoch(ib, name != "accumulate")
            ib.dataloader = batches
        return step_peak(go, baseline=static_bytes(ib.model, ib.optimizer)).peak_bytes

    out = {"bench": "infinity_batch", "torch": torch.__version__, "threads": 1, "memory_limit": limit,
           "largest_fitting_batch": P, "logical_batch": logical, "probe_seconds": round(found.seconds, 2),
           "method": "thread CPU time, interleaved blocks; ratio = samples/s over the mean of the neighbouring "
                     "plain blocks; median of paired ratios, 95% bootstrap interval", "sides": {}}
    for name in sides:
        entry = {"samples_per_s": round(statistics.median(r for n, r in series if n == name), 1),
                 "peak_bytes": peak_of(name), "micro_batch": P if name == "plain" else ibs[name].micro_batch_size}
        entry["fits"] = entry["peak_bytes"] <= limit
        if name != "plain":
            ratios = paired_ratios([(("hand" if n == "plain" else n), r) for n, r in series], name)
            entry["vs_plain"] = round(statistics.median(ratios), 4)
            entry["vs_plain_ci95"] = [round(v, 4) for v in bootstrap(ratios)]
        out["sides"][name] = entry
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
