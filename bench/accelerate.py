"""auto_accelerate's fully automatic mode: the strategy it picks vs every single method and the best
hand-picked combination, and what the search costs.

    .venv/bin/python bench/accelerate.py                  # ~1.2 min on the 2-core machine
    .venv/bin/python bench/accelerate.py --rounds 2 --excluded native_dynamo   # smoke test

Two models, SGD with momentum, float32 weights, in-memory data, one process, one torch thread:

* **cnn**: the demo CNN of ``ga_wrapper.py`` and ``infinity_batch.py`` (three 3×3 convolutions,
  32/64/128 channels, pooling, a linear head; 3×32×32 images, 10 classes), batch 64;
* **mlp**: 256-1024-1024-10 (the model of ``overhead.py``), batch 64.

For each model, first the search: ``auto_accelerate(load_strategy=None, time_limit=...)`` on the
model and data, timed (``search_seconds``: the search's own ``elapsed``; ``call_seconds``: the
whole call, the final apply included). Then the sides, each built with ``apply_strategy`` on its
own copy of the same initial model: **plain** (no method), **each single method** the search
considered for the model, **every combination** of two and three of them that can be combined
(the hand-picked ones: a person trying everything), and a **control**, a second copy of the
strategy the search picked. **auto** is the side of the picked strategy (a side of its own only
when it is none of the above).
They take turns in rounds (the order rotated every round) of ``--block`` training steps each,
timed in this thread's CPU time (with one torch thread every kernel runs on it, and time other
processes take from the shared machine does not count; compiled sides warm up first). Each
block is divided by the mean of the plain blocks just before and after it; reported per side: the
median of those paired ratios with a 95% bootstrap interval. ``best_hand_picked`` is the single
method or combination with the highest median ratio among those the search did not reject (a
rejected one changes the loss: not a strategy to train with); ``auto_vs_best`` pairs each auto
block with the neighbouring blocks of that side likewise (1.0 when auto picked that very strategy),
and ``control_vs_auto`` pairs the control's blocks with auto's (two copies of one strategy: the
method's own spread between sides, 1.0 if fair). ``met``: auto_vs_best >= ``TARGET`` for every
model. One JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ga_wrapper import bootstrap, paired_ratios  # noqa: E402

from flextrain.accelerate import Inputs, Strategy, apply_strategy, auto_accelerate, conflict  # noqa: E402
from flextrain.accelerate.results import REJECTED, describe  # noqa: E402
from flextrain.accelerate.search import base_strategy, single_steps  # noqa: E402
from flextrain.elastic.world import World, WorldSource  # noqa: E402

TARGET = 0.95
CONTROL = "control (auto's pick, a second copy)"


class Net(torch.nn.Module):
    """A classifier that takes ``(inputs, labels)`` (``model_input_format="unpack_sequence"``)."""

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.body(x)


def cnn(args) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for c_in, c_out in ((3, 32), (32, 64)):
        layers += [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
    return Net(torch.nn.Sequential(*layers, torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10)))


def mlp(args) -> torch.nn.Module:
    torch.manual_seed(0)
    return Net(torch.nn.Sequential(torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU(),
                                   torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                   torch.nn.Linear(args.hidden, 10)))


MODELS = {"cnn": (cnn, lambda args: (3, 32, 32), "cnn_block"), "mlp": (mlp, lambda args: (args.features,),
                                                                      "mlp_block")}


def loss_func(batch: Any, out: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(out.float(), batch[1])


def log(msg: str) -> None:
    print(f"[accelerate] {msg}", file=sys.stderr, flush=True)


def hand_picked(singles: list) -> list[Strategy]:
    """Every single method, then every combination of two and three that can be combined."""
    out = [Strategy([s]) for s in singles]
    for size in (2, 3):
        for combo in itertools.combinations(singles, size):
            if conflict(s.name for s in combo) is None:
                out.append(Strategy(list(combo)))
    return out


def side(strategy: Strategy, inputs: Inputs, batches: list, warmup: int):
    """A training step over ``strategy`` applied to a copy of the model; returns ``run(steps) -> samples``."""
    applied = apply_strategy(strategy, inputs, device="cpu", copy_model=True, dataloader=False)
    model, optim, loss, prepare = (applied.result.model, applied.result.optim, applied.result.loss_func,
                                   applied.result.prepare_input)
    position = [0]

    def run(steps: int) -> int:
        samples = 0
        for _ in range(steps):
            batch = batches[position[0] % len(batches)]
            position[0] += 1
            data = prepare(batch, "cpu")
            loss(data, model(*data)).backward()
            optim.step()
            optim.zero_grad()
            samples += len(batch[0])
        return samples

    run(warmup)  # compiled sides compile and settle here
    return run


def against(series: list[tuple[str, float]], side: str, other: str) -> list[float]:
    """``side``'s blocks over the neighbouring blocks of ``other`` (a label; "plain" is keyed "hand")."""
    key = "hand" if other == "plain" else other
    renamed = [("hand" if s == key else "plain-side" if s == "hand" else s, v) for s, v in series]
    return paired_ratios(renamed, "plain-side" if side == "plain" else side)


def run_model(name: str, args) -> dict:
    build, shape, block_arg = MODELS[name]
    block = getattr(args, block_arg)
    g = torch.Generator().manual_seed(1)
    n = args.batch * 4
    x, y = torch.randn(n, *shape(args), generator=g), torch.randint(0, 10, (n,), generator=g)
    dataset = torch.utils.data.TensorDataset(x, y)
    batches = [(x[i:i + args.batch], y[i:i + args.batch]) for i in range(0, n, args.batch)]

    log(f"{name}: the search (time_limit {args.time_limit:g} s)")
    started = time.perf_counter()
    status, result, pick = auto_accelerate(
        build(args), torch.optim.SGD, dataset, loss_func, model_input_format="unpack_sequence",
        optim_args={"lr": 0.01, "momentum": 0.9}, dataloader_args={"batch_size": args.batch},
        excluded=args.excluded, time_limit=args.time_limit)
    call_seconds = time.perf_counter() - started
    if not status:
        raise SystemExit(f"{name}: the search found no strategy")
    search = result.args.search
    log(f"{name}: picked {describe(pick)} in {search.elapsed:.1f} s\n{search.table()}")
    searched = {c.strategy: c for c in search.candidates}

    inputs = Inputs.checked(build(args), optim_func=torch.optim.SGD, optim_args={"lr": 0.01, "momentum": 0.9},
                            loss_func=loss_func, model_input_format="unpack_sequence")
    world = World(processes=1, rank=0, devices_per_process=1, source=WorldSource.LOCAL_DEVICES)
    base, _ = base_strategy(inputs.model, torch.device("cpu"), world)
    singles = single_steps(inputs.model, torch.device("cpu"), world, base, excluded=args.excluded or ())
    strategies = {"plain": Strategy([])}
    strategies.update({describe(s): s for s in hand_picked(singles)})
    # auto's side is the side of the strategy it picked (one of those, unless it picked another config)
    auto = next((label for label, st in strategies.items() if st == pick), "auto")
    strategies[auto] = pick
    strategies[CONTROL] = pick  # a second copy of it: an A/A control of the method
    runs = {}
    for label, strategy in strategies.items():
        log(f"{name}: building {label}")
        runs["hand" if label == "plain" else label] = side(strategy, inputs, batches, warmup=args.warmup)

    order, series = list(runs), []
    for r in range(args.rounds):
        k = r % len(order)
        for label in order[k:] + order[:k]:
            start = time.thread_time()
            samples = runs[label](block)
            series.append((label, samples / (time.thread_time() - start)))
        log(f"{name}: round {r + 1}/{args.rounds}")

    sides: dict[str, dict] = {}
    for label, strategy in strategies.items():
        key = "hand" if label == "plain" else label
        entry: dict[str, Any] = {"methods": list(strategy.names),
                                 "samples_per_s": round(statistics.median(v for s, v in series if s == key), 1)}
        if label != "plain":
            ratios = paired_ratios(series, key)
            entry["vs_plain"] = round(statistics.median(ratios), 4)
            entry["vs_plain_ci95"] = [round(v, 4) for v in bootstrap(ratios)]
        candidate = searched.get(strategy)
        entry["in_search"] = None if candidate is None else candidate.status
        sides[label] = entry
    eligible = [label for label in strategies if label not in ("plain", "auto", CONTROL)
                and sides[label]["in_search"] != REJECTED]
    best = max(eligible, key=lambda label: sides[label]["vs_plain"]) if eligible else "plain"
    ratios = against(series, auto, best) if best != auto else []
    control = against(series, CONTROL, auto)
    return {
        "model": name, "parameters": sum(p.numel() for p in inputs.model.parameters()), "batch": args.batch,
        "search": {"seconds": round(search.elapsed, 2), "call_seconds": round(call_seconds, 2),
                   "time_limit": search.time_limit, "stopped_early": search.stopped_early,
                   "candidates": len(search.candidates), "dry_runs": len(search.tried),
                   "pick": describe(pick), "pick_methods": list(pick.names),
                   "table": [{k: r[k] for k in ("label", "status", "samples_per_second", "vs_plain", "runs",
                                                "seconds")} for r in search.rows()]},
        "sides": sides, "best_hand_picked": best,
        "auto_side": auto,
        "auto_vs_best": round(statistics.median(ratios), 4) if ratios else 1.0,  # 1.0: it picked the best
        "auto_vs_best_ci95": [round(v, 4) for v in bootstrap(ratios)] if ratios else [1.0, 1.0],
        "auto_vs_plain": sides[auto].get("vs_plain", 1.0),
        "control_vs_auto": round(statistics.median(control), 4),
        "control_vs_auto_ci95": [round(v, 4) for v in bootstrap(control)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["cnn", "mlp"])
    p.add_argument("--rounds", type=int, default=20, help="turns of each side per model")
    p.add_argument("--cnn-block", type=int, default=3, help="training steps per turn (cnn)")
    p.add_argument("--mlp-block", type=int, default=16, help="training steps per turn (mlp)")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps of each side before the rounds")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--time-limit", type=float, default=120.0, help="the search's time_limit (seconds)")
    p.add_argument("--excluded", nargs="*", default=None, help="methods neither the search nor the sides use")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64  # a compiled side per combination: more than dynamo's default 8
    models = {name: run_model(name, args) for name in args.models}
    result = {
        "bench": "accelerate",
        "method": "auto_accelerate's search timed, then every side (plain, each single method, every "
                  "2- and 3-method combination, a second copy of auto's pick) in interleaved blocks in one process, thread "
                  "CPU time, 1 torch thread; ratio = a side's block over the mean of the neighbouring plain "
                  "(for auto_vs_best: best hand-picked) blocks; median of paired ratios, 95% bootstrap interval",
        "torch": torch.__version__, "threads": 1, "rounds": args.rounds, "excluded": args.excluded or [],
        "models": models, "target": TARGET,
        "met": all(m["auto_vs_best"] >= TARGET for m in models.values()),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
