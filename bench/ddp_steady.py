"""Steady training throughput of an N-worker flextrain job vs torchrun + DDP, interleaved.

Four sides, each a process tree, take turns in ``--window``-second windows (``bench/interleave.py``;
every other side is SIGSTOP-ed meanwhile): ``flextrain`` (an AllReduce job of ``--workers`` local
workers, bucketed gradient reduction overlapped with backward: the default, ``--bucket-mb 25``),
``flat`` (the same job with ``--bucket-mb 0``: one reduction after backward, as before issue 26),
``ddp`` (``torch.distributed.run --standalone --nproc-per-node N`` of ``bench/steady/ddp_train.py``:
plain DDP over gloo) and ``control`` (a second, identical ``ddp`` side: ``control_vs_ddp`` is an
A/A ratio, the method's own error). Same model (``--model digits``: the zoo's 4.8 k-parameter MLP; ``wide``:
13.3 M parameters), optimizer, loss, global batch (one micro-batch per worker), digits data and
one torch thread per process. Every side stamps ``time.perf_counter()`` after each optimizer step;
a window's rate is steps/s from the end of its first step to the end of its last. Each figure is
the median over a side's windows of its rate / the base side's rate interpolated between the
base windows before and after it, with a 95% bootstrap interval: ``flextrain_vs_ddp``,
``flat_vs_ddp``, ``flextrain_vs_flat`` and ``control_vs_ddp``. All sides start (unmeasured) before the turns begin;
the turns end when the ``flextrain`` job does.

    .venv/bin/python bench/ddp_steady.py --model digits --workers 3
    .venv/bin/python bench/ddp_steady.py --model wide --workers 2 --window 2 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from interleave import (StepSeries, intervals_by_position, median_ci, paired_ratios, rated_windows,  # noqa: E402
                        take_turns)
from machine import ProcessTree, descendants, log  # noqa: E402
from overhead_sides import flextrain_cmd  # noqa: E402

MODULE = HERE / "steady" / "digits_models.py"
CLASSES = {"digits": "Model", "wide": "Wide"}
PAIRS = {"flextrain_vs_ddp": ("flextrain", "ddp"), "flat_vs_ddp": ("flat", "ddp"),
         "flextrain_vs_flat": ("flextrain", "flat"), "control_vs_ddp": ("control", "ddp")}
ORDER = ["flextrain", "ddp", "flat", "control"]


def stamps(directory: Path) -> list[float]:
    """The step stamps of the process that stamped most (every member of a side steps in lockstep)."""
    best: list[float] = []
    for path in directory.glob("steps-*.txt"):
        lines = path.read_text().split()
        if len(lines) > len(best):
            best = [float(x) for x in lines[:-1]]  # the last line may be half written
    return best


def wait_steps(directory: Path, proc: subprocess.Popen, count: int, *, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while len(stamps(directory)) < count:
        if proc.poll() is not None:
            raise SystemExit(f"a side exited with {proc.returncode} before it trained; see {directory}")
        if time.monotonic() > deadline:
            raise SystemExit(f"a side did not train within {timeout:.0f}s; see {directory}")
        time.sleep(0.2)


def start(cmd: list[str], out: Path, env: dict) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "output.txt", "wb") as f:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, **env, "BENCH_STEP_DIR": str(out)}, start_new_session=True)


def job(args, data_dir: Path, out: Path, *, epochs: int, bucket_mb: float) -> subprocess.Popen:
    cmd = flextrain_cmd() + [
        "train", "--model-def", f"{MODULE}:{CLASSES[args.model]}", "--training-data", str(data_dir),
        "--workers", str(args.workers), "--epochs", str(epochs), "--global-batch-size", str(args.global_batch),
        "--seed", "0", "--lr", str(args.lr), "--no-progress", "--job-dir", str(out / "job"),
        "--bucket-mb", str(bucket_mb)]
    return start(cmd, out, {"FLEXTRAIN_NUM_THREADS": "1"})


def ddp(args, root: Path, name: str) -> subprocess.Popen:
    return start([sys.executable, "-m", "torch.distributed.run", "--standalone",
                  f"--nproc-per-node={args.workers}", str(HERE / "steady" / "ddp_train.py"),
                  "--model", args.model, "--data", str(root / "data.pt"),
                  "--global-batch", str(args.global_batch), "--lr", str(args.lr)],
                 root / name, {"OMP_NUM_THREADS": "1"})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(CLASSES), default="digits")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=40, help="of the flextrain side (its end ends the turns)")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--window", type=float, default=0.5)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="of the flextrain side (the flat side: 0)")
    p.add_argument("--min-window-steps", type=int, default=3)
    p.add_argument("--work-dir", default=None, help="keep logs and stamps here")
    args = p.parse_args(argv)
    import torch

    from flextrain.data import open_reader
    from flextrain.data.digits import decode_digits, write_digits

    root = Path(args.work_dir or tempfile.mkdtemp(prefix="ddp-steady-"))
    if root.exists():
        shutil.rmtree(root)
    write_digits(root / "digits")
    data_dir = root / "digits" / "train"
    records = [r for f in sorted(data_dir.iterdir()) for r in open_reader(str(f)).read()]
    x, y = decode_digits(records)
    torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y).long()}, root / "data.pt")
    procs: dict[str, subprocess.Popen] = {}
    try:
        trees = {}
        for side in ("ddp", "control", "flat"):  # each trains a little, then waits paused for the turns
            procs[side] = ddp(args, root, side) if side != "flat" else \
                job(args, data_dir, root / side, epochs=args.epochs * 2, bucket_mb=0)
            wait_steps(root / side, procs[side], 10)
            trees[side] = ProcessTree(procs[side].pid)
            trees[side].pause()
        procs["flextrain"] = job(args, data_dir, root / "flextrain", epochs=args.epochs, bucket_mb=args.bucket_mb)
        wait_steps(root / "flextrain", procs["flextrain"], 10)
        trees["flextrain"] = ProcessTree(procs["flextrain"].pid)
        log(f"all sides train; they take turns in {args.window:g}s windows until the flextrain job ends")
        windows = take_turns(trees=trees, order=ORDER, seconds=args.window, until=procs["flextrain"])
    finally:
        for name, proc in procs.items():
            # every descendant by pid: torchrun starts its workers in sessions of their own,
            # so killing the agent's process group would leave them training
            for pid in reversed(descendants(proc.pid)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    if procs["flextrain"].returncode != 0:
        raise SystemExit(f"the flextrain job failed ({procs['flextrain'].returncode}); see {root / 'flextrain'}")
    series = {}
    for side in ORDER:
        times = stamps(root / side)
        series[side] = StepSeries(times, [1] * len(times))
    rated = rated_windows(windows, series, min_steps=args.min_window_steps)
    result = {"model": args.model, "workers": args.workers, "global_batch": args.global_batch,
              "window_s": args.window, "bucket_mb": args.bucket_mb, "load_avg_1m": os.getloadavg()[0]}
    for key, (side, base) in PAIRS.items():
        ratios = paired_ratios(rated, side=side, base=base)
        if len(ratios) < 5:
            result[key] = None
            continue
        result[key] = round(statistics.median(ratios), 4)
        result[f"{key}_ci95"] = [round(v, 4) for v in median_ci(ratios)]
        result[f"{key}_pairs"] = len(ratios)
    result["steps_per_s"] = {side: round(statistics.median(r["rate"] for r in rated if r["side"] == side), 2)
                             for side in ORDER if any(r["side"] == side for r in rated)}
    result["windows"] = {side: sum(r["side"] == side for r in rated) for side in ORDER}
    # what resuming costs each side: median ms of its 1st, 2nd, 3rd step interval in a window, then the rest
    result["step_ms_by_position"] = {side: [round(v * 1e3, 3) for v in intervals_by_position(
        series[side], windows, side=side, first=3)] for side in ORDER}
    result["method"] = __doc__.split("\n\n")[1].replace("\n", " ")
    print(json.dumps(result))
    if not args.work_dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
