"""flextrain overhead benchmark: a 1-worker flextrain job vs. plain PyTorch loops.

Runs the same model (``bench/models/mlp.py``: 256 -> 1024 -> 1024 -> 10 MLP,
SGD with momentum) on the same synthetic RecordIO data, with the same global
batch, data order, seed and number of torch threads as three sides:

  stream     a plain PyTorch loop in this process that reads each step's
             records from the RecordIO files with flextrain's reader and
             turns them into tensors with the module's ``feed`` as it goes
             (what a user training on these files writes), then
             ``zero_grad / forward / loss / backward / loss.item() / step``;
  memory     the same loop over tensors read and ``feed``-ed once before the
             clock starts (a data set held in memory: no reading at all);
  flextrain  ``flextrain train --workers 1 --no-progress ...`` as a subprocess.

``ratio`` = flextrain / memory: flextrain is charged for reading its data at
all. ``ratio_vs_stream`` = flextrain / stream is like for like: both read and
``feed`` the same records during training, so it is what flextrain's
orchestration costs (tasks, RPCs, heartbeats, the master, its threads).

Every side records ``time.perf_counter()`` after each optimizer step (the bench
module's optimizer has a post-step hook; the flextrain worker writes its list to
a file at exit, ``FLEXTRAIN_BENCH_STEP_TIMES``). Two methods:

  interleaved (default)  one long flextrain job and the two plain loops take
             turns in short windows (``--window``, 0.5 s): flextrain's master
             and worker are SIGSTOP-ed outside their windows, the plain loops
             run in this process meanwhile. Each flextrain window's rate is
             divided by the baseline's rate at the same moment (interpolated
             between its neighbouring windows), and the median of these paired
             ratios is reported with a 95% bootstrap interval. This cancels
             most of the machine's drift (see ``bench/interleave.py``). It
             measures the steady per-step cost; one-off costs (start-up, the
             first decode of each file) are outside the windows.
  runs       whole runs of each side, repeated (``--repeats``), taking turns
             (``bench/overhead_runs.py``); includes the one-off costs but
             cannot resolve a few percent on a noisy 2-core VM.

On a 2-core machine any other busy process slows 2-thread training several-
fold, so the CPU other processes use meanwhile is measured
(``other_cpu_cores``); the bench first waits for a quiet CPU.

Usage (from the repository root):

    .venv/bin/python bench/overhead.py                     # interleaved, ~2.5 min on an idle 2-core box
    .venv/bin/python bench/overhead.py --method runs       # 12 whole runs per side, ~8 min
    .venv/bin/python bench/overhead.py --records 8192 --epochs 16             # smoke test, interleaved
    .venv/bin/python bench/overhead.py --method runs --repeats 1 --records 4096   # smoke test, runs

stdout: exactly one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from interleave import (JOB, StepSeries, intervals_by_position, median_ci, paired_ratios, rated_windows,
                        run_windows, step_intervals)
from machine import CPUMeter, ProcessTree, log, wait_until_quiet
from overhead_sides import (PlainLoop, finished_job, job_command, job_output, load_module, run_job,
                            step_sizes, write_data)

TARGET_RATIO = 0.97
DEFAULT_EPOCHS = {"interleaved": 20, "runs": 2}
ORDER = [JOB, "memory", JOB, "stream"]  # every flextrain window next to one of each baseline

INTERLEAVED = (
    "interleaved: one flextrain job of --epochs and the two in-process loops take turns in windows of "
    "--window seconds (order flextrain, memory, flextrain, stream, ...); the job's processes are "
    "SIGSTOP-ed outside its windows. A window's samples/s runs from the end of its first step to the "
    "end of its last (the step straddling a pause is not counted; windows with fewer than "
    "--min-window-steps steps are dropped). ratio = median over flextrain windows of flextrain's rate "
    "/ memory's rate interpolated between the memory windows before and after it; ratio_vs_stream "
    "likewise; *_ci95 = percentile bootstrap of that median. Start-up and the windows' first steps "
    "excluded; reading, feed, task RPCs, heartbeats and the master's work included."
)


def wait_for_training(proc, job_dir: Path, *, timeout: float = 600.0) -> None:
    """Until the job's status shows its first steps (start-up runs alone, unmeasured)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if json.loads((job_dir / "status.json").read_text()).get("step", 0) >= 2:
                return
        except (OSError, ValueError):
            pass  # not written yet, or being replaced
        time.sleep(0.1)


def interleaved(args, mlp, files: list[str], *, data_dir: Path, root: Path, sizes: list[int]) -> dict:
    G = args.global_batch_size
    loops = {name: PlainLoop(mlp, files, batch=G, seed=args.seed, lr=args.lr, stream=name == "stream")
             for name in ("memory", "stream")}
    for loop in loops.values():  # warm-up, unmeasured: a pass over the data (decodes every chunk once)
        for _ in range(len(sizes) // args.epochs):
            loop.step()
    for loop in loops.values():
        loop.series.times.clear()
        loop.series.samples.clear()
    job_dir = root / "job"
    cmd = job_command(data_dir, job_dir, batch=G, epochs=args.epochs, seed=args.seed, lr=args.lr,
                      extra=args.job_arg)
    waited = wait_until_quiet(args.max_other_cpu, args.quiet_wait)
    with CPUMeter() as meter:  # from start to exit: the job's CPU counts as ours once it is reaped
        proc = run_job(mlp, cmd, job_dir)
        try:
            wait_for_training(proc, job_dir)
            log(f"flextrain is training; taking turns in {args.window:g}s windows until it ends")
            windows = run_windows(proc=proc, tree=ProcessTree(proc.pid),
                                  loops={name: loop.step for name, loop in loops.items()},
                                  order=ORDER, seconds=args.window)
        finally:
            if proc.poll() is None:
                proc.kill()
            returncode = proc.wait()
    status, times = finished_job(job_dir, cmd, returncode, job_output(job_dir))
    if len(times) != len(sizes):
        raise SystemExit(f"flextrain recorded {len(times)} optimizer steps, expected {len(sizes)}")
    series = {JOB: StepSeries(times, sizes), **{name: loop.series for name, loop in loops.items()}}
    rated = rated_windows(windows, series, min_steps=args.min_window_steps)
    ratios = {base: paired_ratios(rated, side=JOB, base=base) for base in ("memory", "stream")}
    stream_cost = paired_ratios(rated, side="stream", base="memory")
    if min(len(r) for r in ratios.values()) < 10:
        raise SystemExit(f"only {min(len(r) for r in ratios.values())} paired windows: run more --epochs")
    rate = {side: statistics.median(r["rate"] for r in rated if r["side"] == side) for side in series}
    ci = {base: median_ci(r) for base, r in ratios.items()}
    intervals = {side: step_intervals(s, windows, side=side) for side, s in series.items()}
    ratio = statistics.median(ratios["memory"])
    other = None if meter.other_cores is None else round(meter.other_cores, 3)
    if other is not None and other > args.max_other_cpu:
        log(f"WARNING: other processes used {other:.2f} cores meanwhile; numbers are noisy")
    return {
        "memory_samples_per_s": round(rate["memory"], 1),
        "stream_samples_per_s": round(rate["stream"], 1),
        "flextrain_samples_per_s": round(rate[JOB], 1),
        "ratio": round(ratio, 4),
        "ratio_ci95": [round(x, 4) for x in ci["memory"]],
        "ratio_vs_stream": round(statistics.median(ratios["stream"]), 4),
        "ratio_vs_stream_ci95": [round(x, 4) for x in ci["stream"]],
        "stream_vs_memory": round(statistics.median(stream_cost), 4),
        "meets_target_at_ci95_lower_bound": ci["memory"][0] >= TARGET_RATIO,
        "epochs": args.epochs,
        "steps": len(sizes),
        "method": INTERLEAVED,
        "runs": {
            "window_seconds": args.window,
            "windows": {side: sum(r["side"] == side for r in rated) for side in series},
            "windows_dropped": len(windows) - len(rated),
            "pairs": {base: len(r) for base, r in ratios.items()},
            "median_steps_per_window": {side: statistics.median(r["steps"] for r in rated if r["side"] == side)
                                        for side in series},
            # median and mean step inside the windows: a gap between them is a tail of slow steps
            "step_ms": {side: {"median": round(1e3 * statistics.median(v), 3), "mean": round(1e3 * statistics.fmean(v), 3)}
                        for side, v in intervals.items()},
            # median 1st, 2nd, 3rd step interval in a window, then the rest: the cost of resuming
            "step_ms_by_position": {side: [round(1e3 * x, 3) for x in intervals_by_position(s, windows, side=side)]
                                    for side, s in series.items()},
            "paired_ratios_vs_memory": [round(x, 3) for x in ratios["memory"]],  # in time order
            "paired_ratios_vs_stream": [round(x, 3) for x in ratios["stream"]],
            "other_cpu_cores": other,
            "waited_for_quiet_s": round(waited, 1),
            "job_steps": status.get("step"),
            "mean_loss": {name: loop.mean_loss for name, loop in loops.items()},
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=("interleaved", "runs"), default="interleaved")
    p.add_argument("--records", type=int, default=32768, help="training records (1028 bytes each)")
    p.add_argument("--files", type=int, default=4, help="RecordIO files (shards) the records are spread over")
    p.add_argument("--global-batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=None,
                   help=f"epochs of the flextrain job (default {DEFAULT_EPOCHS})")
    p.add_argument("--window", type=float, default=0.5, help="interleaved: seconds per window")
    p.add_argument("--min-window-steps", type=int, default=5, help="interleaved: fewer steps drop a window")
    p.add_argument("--repeats", type=int, default=12, help="runs: whole runs per side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the module's)")
    p.add_argument("--max-other-cpu", type=float, default=0.1,
                   help="other processes using more CPU cores than this (on average) make a run disturbed")
    p.add_argument("--retries", type=int, default=2, help="runs: repeats of a run disturbed by other processes")
    p.add_argument("--quiet-wait", type=float, default=20.0,
                   help="seconds to wait at most, before each run, for other processes to leave the CPU idle")
    p.add_argument("--max-seconds", type=float, default=900.0,
                   help="runs: after this long, stop waiting for a quiet CPU and stop repeating disturbed runs")
    p.add_argument("--job-arg", action="append", default=[], metavar="ARG",
                   help="one more `flextrain train` argument for the job (repeatable), e.g. --job-arg=--steps-per-task=32")
    p.add_argument("--workdir", help="keep data and job dirs here instead of a temp dir")
    args = p.parse_args(argv)
    args.epochs = args.epochs or DEFAULT_EPOCHS[args.method]

    # flextrain's local backend gives its workers cpu_count // max_workers threads
    # (flextrain/master/main.py); with one worker that is every core. Match it.
    threads = max(1, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    mlp = load_module()
    G = args.global_batch_size

    tmp = None
    if args.workdir:
        root = Path(args.workdir).resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="flextrain-bench-")
        root = Path(tmp.name)
    try:
        from flextrain.data import make_shards

        data_dir = root / "train"
        t0 = time.perf_counter()
        files = write_data(data_dir, mlp, records=args.records, files=args.files, seed=args.seed)
        sizes = step_sizes([s.size for s in make_shards(data_dir)], G, args.epochs)
        log(f"wrote {args.records} records in {len(files)} files to {data_dir} ({time.perf_counter() - t0:.1f}s); "
            f"G={G}, threads={threads}, method {args.method}, {len(sizes)} flextrain steps per run")
        if args.method == "runs":
            from overhead_runs import measure

            fields = measure(args, mlp, files, data_dir=data_dir, root=root, sizes=sizes)
        else:
            fields = interleaved(args, mlp, files, data_dir=data_dir, root=root, sizes=sizes)
        print(json.dumps({
            "bench": "overhead",
            **{k: v for k, v in fields.items() if k not in ("method", "runs")},
            "target_ratio": TARGET_RATIO,
            "meets_target": fields["ratio"] >= TARGET_RATIO,
            "global_batch_size": G,
            "threads": threads,
            "records": args.records,
            "files": len(files),
            "job_args": args.job_arg,
            "model": "bench/models/mlp.py:Model (256-1024-1024-10 MLP, SGD momentum 0.9)",
            "method": fields["method"],
            "runs": fields["runs"],
        }))
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
