"""Step-time cost of in-memory ("flash") checkpoints on the demo job, amplified and fitted.

Sides take turns in short windows (``bench/interleave.py``: each side's process tree runs alone
while every other one is SIGSTOP-ed), all copies of the demo's AllReduce job (digits MLP,
``--workers 2 --global-batch-size 64 --max-micro-batch 32``, one torch thread per worker):
``flash-N`` for each N of ``--every`` (default 5, 10, 25, 50: ``--memory-checkpoint-steps N``;
rank 0 encodes its state and hands it to a background thread, which puts it into shared memory
(the master resolves its ledger on its own) and writes one to disk when due by ``--persist-every``
and ``--persist-seconds``), ``plain``
(``--memory-checkpoint-steps 0``, every third window) and ``control`` (a second ``plain``: the
method's own A/A check). Every side stamps ``time.perf_counter()`` after each optimizer step
(``bench/steady/digits_models.py``); a window's rate is steps/s from the end of its first step to
the end of its last. A paired ratio is plain's rate (interpolated between its neighbouring windows)
/ a side's rate, i.e. the step-time ratio (1.01 = 1% slower); ``vs_plain`` per side is their median
with a 95% bootstrap interval. Why amplify: 1% at N = 50 is below what one interleaved ratio
resolves on this machine (an A/A control is off 1.0 by 1-3%), but a snapshot's cost is fixed, so
the excess is linear in snapshots per step x: ``ratio - 1 = a + b x``, x = 1/N (times the share of
snapshots the writer worked on, from the side's account: one superseded before the writer took it
cost only its copy), the control at x = 0. ``b`` (one snapshot's cost in plain steps) is the
least-squares slope through the sides' median excesses, ``a`` absorbs the method's bias, and the cost
at N = 50 is ``b / 50``; their intervals come from a bootstrap that resamples every side's paired
ratios. ``linear``: every side's own interval holds the fitted line. ``wall_fit`` fits the step-time
ratios; ``cpu_fit`` the same with CPU per step (each side's process tree, master and workers, inside
a window per step it made there, paired the same way): what a snapshot costs in work, which the
neighbours' noise moves far less, though waiting is not in it. The turns end when every flash side has ended (its log holds its account of its
snapshots: ``snapshots``).
"""

from __future__ import annotations

import argparse
import bisect
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

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ddp_steady import stamps, start, wait_steps  # noqa: E402
from interleave import StepSeries, cpu_per_step, median_ci, paired_ratios, rated_windows, take_turns  # noqa: E402
from machine import ProcessTree, descendants, log  # noqa: E402
from overhead_sides import flextrain_cmd  # noqa: E402

MODULE = HERE / "steady" / "digits_models.py"
TARGET_N = 50


def job(args, data_dir: Path, out: Path, *, epochs: int, every: int) -> subprocess.Popen:
    cmd = flextrain_cmd() + [
        "train", "--model-def", f"{MODULE}:Model", "--training-data", str(data_dir),
        "--workers", "2", "--epochs", str(epochs), "--global-batch-size", "64", "--max-micro-batch", "32",
        "--seed", "0", "--lr", "0.1", "--no-progress", "--job-dir", str(out / "job"),
        "--memory-checkpoint-steps", str(every), "--memory-checkpoint-persist-every", str(args.persist_every)]
    if args.persist_seconds is not None:  # else the job default (a checkout without the flag has none)
        cmd += ["--memory-checkpoint-persist-seconds", str(args.persist_seconds)]
    # INFO on every side alike: rank 0's account of its snapshots is an INFO line (flash_counters)
    return start(cmd, out, {"FLEXTRAIN_NUM_THREADS": "1", "FLEXTRAIN_LOG_LEVEL": "INFO"})


def flash_counters(job_dir: Path) -> dict | None:
    """Rank 0's own account of its snapshots: the last ``in-memory checkpoints:`` line its log holds
    (worker/flash.py writes one as it closes)."""
    found = None
    for log_file in sorted(job_dir.glob("logs/worker-*.log")):
        for line in log_file.read_text(errors="replace").splitlines():
            if "in-memory checkpoints: " in line:
                try:
                    found = json.loads(line.split("in-memory checkpoints: ", 1)[1])
                except ValueError:
                    pass
    return found


class FirstExit:
    """``take_turns``' ``until`` for several jobs: done when any of them has exited. Only the side in its
    window can exit (the others are stopped), so a window simply runs its length."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs

    def poll(self):
        return next((p.returncode for p in self.procs if p.poll() is not None), None)

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.02))  # a window's length, not a synchronisation: rates come from stamps
        if self.poll() is None:
            raise subprocess.TimeoutExpired("flash sides", timeout)


def turn_order(sides: list[str]) -> list[str]:
    """``plain`` before every two other sides, so each side's windows have a plain window near them."""
    order = []
    for k in range(0, len(sides), 2):
        order += ["plain", *sides[k:k + 2]]
    return order


def fit(points: dict[float, list[float]], *, resamples: int = 2000, seed: int = 0) -> dict:
    """``y = a + b x`` through the median of each x's values (least squares over the medians), and a
    bootstrap of ``b`` that resamples each x's values. Returns a, b, b's 95% interval and the line's
    interval at each x (for the linearity check)."""
    xs = np.array(sorted(points))
    groups = [np.asarray(points[x], dtype=float) for x in xs]

    def line(medians):
        b, a = np.polyfit(xs, medians, 1)
        return a, b

    a, b = line(np.array([np.median(g) for g in groups]))
    rng = np.random.default_rng(seed)
    boot = np.array([line(np.array([np.median(rng.choice(g, size=len(g))) for g in groups]))
                     for _ in range(resamples)])
    return {"a": float(a), "b": float(b), "a_ci95": [float(v) for v in np.percentile(boot[:, 0], [2.5, 97.5])],
            "b_ci95": [float(v) for v in np.percentile(boot[:, 1], [2.5, 97.5])]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", default="5,10,25,50",
                   help="--memory-checkpoint-steps of the flash sides, comma-separated (one side each)")
    p.add_argument("--persist-every", type=int, default=4,
                   help="--memory-checkpoint-persist-every of the flash sides (4: the job default)")
    p.add_argument("--persist-seconds", type=float, default=None,
                   help="--memory-checkpoint-persist-seconds of the flash sides (default: the job's, 30; "
                        "0: by count alone, as before it existed)")
    p.add_argument("--epochs", type=int, default=200, help="of each flash side (their ends end the turns)")
    p.add_argument("--window", type=float, default=0.5)
    p.add_argument("--min-window-steps", type=int, default=3)
    p.add_argument("--work-dir", default=None, help="keep logs and stamps here")
    args = p.parse_args(argv)
    try:
        everies = sorted({int(v) for v in args.every.split(",")})
    except ValueError:
        p.error(f"--every takes whole numbers separated by commas, not {args.every!r}")
    if not everies or everies[0] < 1:
        p.error(f"--every needs positive step counts, not {args.every!r}")
    from flextrain.data.digits import write_digits

    flash = {f"flash-{n}": n for n in everies}
    sides = ["plain", "control", *flash]
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="flash-bench-"))
    if root.exists():
        shutil.rmtree(root)
    write_digits(root / "digits")
    data_dir = root / "digits" / "train"
    procs: dict[str, subprocess.Popen] = {}
    trees: dict[str, ProcessTree] = {}
    windows = []
    try:
        for side in sides:
            epochs = args.epochs if side in flash else args.epochs * 3
            procs[side] = job(args, data_dir, root / side, epochs=epochs, every=flash.get(side, 0))
        # Every side trains before any is paused: a tree paused while the others start (a minute or more on
        # a loaded machine) would find its RPCs past their deadlines and its workers "hung" when resumed.
        for side in sides:
            wait_steps(root / side, procs[side], 10)
            trees[side] = ProcessTree(procs[side].pid)
            trees[side].pause()
        log(f"{len(sides)} sides train; they take turns in {args.window:g}s windows until the flash jobs end")
        live = dict(flash)
        while live:
            order = turn_order([*live, "control"])
            windows += take_turns(trees={s: trees[s] for s in set(order)}, order=order, seconds=args.window,
                                  until=FirstExit([procs[s] for s in live]), cpu=True)
            live = {s: n for s, n in live.items() if procs[s].poll() is None}
            log(f"flash sides still training: {', '.join(live) or 'none'}")
    finally:
        for proc in procs.values():
            for pid in reversed(descendants(proc.pid)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    for side in flash:
        if procs[side].returncode != 0:
            raise SystemExit(f"the {side} job failed ({procs[side].returncode}); see {root / side}")
    if args.work_dir:  # to summarise again: summarise(args, root, [Window(**w) for w in ...], ...)
        (root / "windows.json").write_text(json.dumps([w.__dict__ for w in windows]))
    print(json.dumps(summarise(args, root, windows, flash=flash, sides=sides)))
    if not args.work_dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def cpu_rated(windows: list, series: dict[str, StepSeries], *, min_steps: int) -> list[dict]:
    """Like ``rated_windows``, with steps per CPU second of the side's process tree as the "rate": paired
    the same way, a ratio's inverse is a CPU-per-step ratio."""
    out = []
    for w in windows:
        if w.cpu:
            lo = bisect.bisect_right(series[w.side].times, w.start)
            hi = bisect.bisect_right(series[w.side].times, w.end)
            if hi - lo >= max(2, min_steps):
                out.append({"side": w.side, "t": (w.start + w.end) / 2, "rate": (hi - lo) / w.cpu})
    return out


def per_snapshot(excess: dict[float, list[float]], unit_ms: float) -> dict:
    """The fit of ``excess`` (ratio - 1 by snapshots per step) in ms per snapshot (``unit_ms``: a plain
    step's ms) and as the cost at N = 50."""
    f = fit(excess)
    return {"per_snapshot_ms": round(f["b"] * unit_ms, 4),
            "per_snapshot_ms_ci95": [round(v * unit_ms, 4) for v in f["b_ci95"]],
            f"projected_cost_at_{TARGET_N}": round(f["b"] / TARGET_N, 5),
            f"projected_cost_at_{TARGET_N}_ci95": [round(v / TARGET_N, 5) for v in f["b_ci95"]],
            "intercept": round(f["a"], 4), "intercept_ci95": [round(v, 4) for v in f["a_ci95"]],
            "b": f["b"], "a": f["a"]}


def summarise(args, root: Path, windows: list, *, flash: dict[str, int], sides: list[str]) -> dict:
    series = {side: StepSeries(t := stamps(root / side), [1] * len(t)) for side in sides}
    rated = rated_windows(windows, series, min_steps=args.min_window_steps)
    by_cpu = cpu_rated(windows, series, min_steps=args.min_window_steps)
    plain_step_ms = 1e3 / statistics.median(r["rate"] for r in rated if r["side"] == "plain")
    result = {"every": list(flash.values()), "persist_every": args.persist_every,
              "persist_seconds": args.persist_seconds, "workers": 2, "global_batch": 64,
              "window_s": args.window, "plain_step_ms": round(plain_step_ms, 4),
              "steps": {side: len(series[side].times) for side in sides}, "sides": {}}
    cpu = {side: cpu_per_step(series[side], windows, side=side) for side in sides}
    result["cpu_ms_per_step"] = {side: round(v * 1e3, 4) for side, v in cpu.items() if v}
    excess: dict[str, dict[float, list[float]]] = {"wall": {}, "cpu": {}}
    for side in ["control", *flash]:
        entry = result["sides"][side] = {}
        x = 0.0
        if side in flash:
            entry["snapshots"] = counts = flash_counters(root / side / "job")
            # x: snapshots the writer worked on per step (one superseded before the writer took it cost
            # only its copy); 1/N when the job's account is missing
            x = 1.0 / flash[side]
            if counts and counts.get("taken"):
                x *= (counts["completed"] + counts.get("refused", 0)) / counts["taken"]  # refused: before 2026-11-27
            entry["snapshots_per_step"] = round(x, 5)
        for kind, table, key in (("wall", rated, "vs_plain"), ("cpu", by_cpu, "cpu_vs_plain")):
            # paired_ratios: side's rate / base's rate; the step-time (CPU-per-step) ratio is its inverse
            ratios = [1.0 / r for r in paired_ratios(table, side=side, base="plain")]
            entry[f"{key}_pairs"] = len(ratios)
            if len(ratios) < 5:
                entry[key] = None
                continue
            entry[key] = round(statistics.median(ratios), 4)
            entry[f"{key}_ci95"] = [round(v, 4) for v in median_ci(ratios)]
            excess[kind][x] = [r - 1.0 for r in ratios]
    for kind, key, unit in (("wall", "vs_plain", plain_step_ms), ("cpu", "cpu_vs_plain", (cpu["plain"] or 0) * 1e3)):
        points = excess[kind]
        if len(points) < 3 or not unit:
            continue
        f = per_snapshot(points, unit)
        a, b = f.pop("a"), f.pop("b")
        # linear: every side's own interval holds the fitted line
        f["linear"] = all(lo - 1.0 <= a + b * x <= hi - 1.0
                          for x, (lo, hi) in ((e["snapshots_per_step"] if "snapshots_per_step" in e else 0.0,
                                               e[f"{key}_ci95"]) for e in result["sides"].values() if e.get(key)))
        result[f"{kind}_fit"] = f
    if "wall_fit" in result:
        result[f"met_below_1pct_at_{TARGET_N}"] = result["wall_fit"][f"projected_cost_at_{TARGET_N}_ci95"][1] < 0.01
    result["method"] = __doc__.split("\n\n")[1].replace("\n", " ")
    return result


if __name__ == "__main__":
    sys.exit(main())
