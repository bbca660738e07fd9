"""A/A check of ``bench/overhead.py``'s interleaved method: is it fair to a side run as a subprocess?

The same plain PyTorch loop runs twice: as a subprocess that is SIGSTOP-ed outside its
windows (the place of the flextrain job) and in this process (the baseline). Everything
else is as in ``overhead.py``: same model, data, batch, threads, windows, pairing and
bootstrap. A fair method gives ratios of ~1.0; a ratio below 1 would be charged to any
subprocess side, flextrain's included. Run for both plain loops (``memory``, ``stream``).

Usage (from the repository root; ~3.5 min on an idle 2-core box):

    .venv/bin/python bench/overhead_aa.py

stdout: exactly one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from interleave import JOB, StepSeries, intervals_by_position, median_ci, paired_ratios, rated_windows, run_windows
from machine import ProcessTree, log, wait_until_quiet
from overhead_sides import PlainLoop, load_module, write_data

MODES = ("memory", "stream")


def plain_loop(files: list[str], mode: str, *, batch: int) -> PlainLoop:
    """A warmed-up loop (one pass over the data) with its step clock cleared."""
    from flextrain.data import open_reader

    loop = PlainLoop(load_module(), files, batch=batch, seed=0, lr=None, stream=mode == "stream")
    for _ in range(sum(-(-len(open_reader(f)) // batch) for f in files)):
        loop.step()
    loop.series.times.clear()
    loop.series.samples.clear()
    return loop


def child(args) -> int:
    """The subprocess side: warm up, say so, run ``--steps`` steps, write the step clock."""
    loop = plain_loop(args.files, args.mode, batch=args.batch)
    Path(args.ready).touch()
    for _ in range(args.steps):
        loop.step()
    Path(args.out).write_text(json.dumps([loop.series.times, loop.series.samples]))
    return 0


def one_mode(mode: str, files: list[str], workdir: Path, args) -> dict:
    loop = plain_loop(files, mode, batch=args.batch)
    ready, out = workdir / f"{mode}.ready", workdir / f"{mode}.json"
    wait_until_quiet(0.1, 20.0)
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--mode", mode, "--steps", str(args.steps),
                             "--batch", str(args.batch), "--ready", str(ready), "--out", str(out), *files])
    try:
        while not ready.exists():  # the child's start-up and warm-up run alone, unmeasured
            if proc.poll() is not None:
                raise SystemExit(f"the {mode} subprocess exited ({proc.returncode}) before training")
            time.sleep(0.05)
        windows = run_windows(proc=proc, tree=ProcessTree(proc.pid), loops={mode: loop.step},
                              order=[JOB, mode], seconds=args.window)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} subprocess failed (exit {proc.returncode})")
    times, samples = json.loads(out.read_text())
    series = {JOB: StepSeries(times, samples), mode: loop.series}
    rated = rated_windows(windows, series, min_steps=5)
    ratios = paired_ratios(rated, side=JOB, base=mode)
    low, high = median_ci(ratios)
    return {"ratio": round(statistics.median(ratios), 4), "ratio_ci95": [round(low, 4), round(high, 4)],
            "pairs": len(ratios),
            # median 1st, 2nd, 3rd step interval in a window, then the rest (as overhead.py)
            "step_ms_by_position": {("subprocess" if side == JOB else "in_process"):
                                    [round(1e3 * x, 3) for x in intervals_by_position(s, windows, side=side)]
                                    for side, s in series.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2200, help="steps of the subprocess side per mode")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--records", type=int, default=32768)
    p.add_argument("--window", type=float, default=0.5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--ready", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))  # as overhead.py
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory(prefix="flextrain-bench-aa-") as tmp:
        files = write_data(Path(tmp) / "train", load_module(), records=args.records, files=4, seed=0)
        result = {}
        for mode in MODES:
            log(f"A/A {mode}: a subprocess loop against the same loop in this process")
            result[mode] = one_mode(mode, files, Path(tmp), args)
    print(json.dumps({"bench": "overhead_aa", "side": "plain loop as a paused subprocess",
                      "base": "the same loop in this process", **result,
                      "steps": args.steps, "global_batch_size": args.batch, "window_seconds": args.window}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
