"""``bench/overhead.py --method interleaved`` (the default): every side a process, taking turns.

One run: four plain-loop processes (``bench/plain_loop.py``: memory, stream, control, a second
memory loop, and checked, a stream loop that also tests its gradients as a flextrain step does)
warm up, then a 1-worker flextrain job starts alone; once it trains,
all five sides take turns in ``--window`` windows (``bench/interleave.py``) until the job
ends. ``--repeats`` runs it again with fresh processes; the result pools every run's paired
ratios, with an interval that resamples whole runs.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from interleave import (JOB, StepSeries, intervals_by_position, paired_ratios, pooled_median_ci, rated_windows,
                        step_intervals, take_turns)
from machine import CPUMeter, ProcessTree, log, wait_until_quiet
from overhead_sides import LoopProcess, finished_job, job_command, job_output, run_job

LOOPS = {"memory": "memory", "stream": "stream", "control": "memory",  # side -> plain_loop.py --mode
         "checked": "checked"}
# Every flextrain window between a memory and a stream window; the control (a second memory
# loop) sits at the mirror-image distances from the memory windows.
ORDER = [JOB, "memory", "control", "stream", "checked"]
# paired ratio -> (side, base). flextrain / memory = stream_vs_memory (reading the files as it
# trains) x checked_vs_stream (the gradient check) x ratio_vs_checked (everything else).
PAIRS = {"ratio": (JOB, "stream"), "ratio_vs_memory": (JOB, "memory"),
         "stream_vs_memory": ("stream", "memory"), "control_vs_memory": ("control", "memory"),
         "checked_vs_stream": ("checked", "stream"), "ratio_vs_checked": (JOB, "checked")}

METHOD = (
    "interleaved: one flextrain job of --epochs and four plain-loop processes (memory, stream, control, a "
    "second memory loop, and checked, the stream loop plus the NaN/inf test of the gradients a flextrain "
    "step makes) take turns in windows of --window seconds (order flextrain, memory, control, stream, "
    "checked, ...); every side's processes are SIGSTOP-ed outside its windows. A window's "
    "samples/s runs from the end of its first step to the end of its last (the step straddling a pause "
    "is not counted; windows with fewer than --min-window-steps steps are dropped). ratio = median over "
    "flextrain windows of flextrain's rate / stream's rate interpolated between the stream windows "
    "before and after it; ratio_vs_memory, stream_vs_memory, control_vs_memory, checked_vs_stream and "
    "ratio_vs_checked likewise "
    "(control_vs_memory is the method's A/A check: 1.0 if it is fair). --repeats runs it again with "
    "fresh processes and pools the paired ratios of all runs; *_ci95 = bootstrap interval of the pooled "
    "median that resamples runs, then windows. Start-up and the windows' first steps excluded; reading, "
    "feed, task RPCs, heartbeats and the master's work included."
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


def one_run(args, mlp, files: list[str], *, data_dir: Path, root: Path, sizes: list[int]) -> dict:
    """One job and four loop processes taking turns: the paired ratios and what they rest on."""
    G = args.global_batch_size
    job_dir = root / "job"
    cmd = job_command(data_dir, job_dir, batch=G, epochs=args.epochs, seed=args.seed, lr=args.lr,
                      extra=args.job_arg)
    waited = wait_until_quiet(args.max_other_cpu, args.quiet_wait)
    with CPUMeter() as meter:  # from start to exit: children's CPU counts as ours once reaped
        loops = {name: LoopProcess(mode, files, root, name=name, batch=G, seed=args.seed, lr=args.lr)
                 for name, mode in LOOPS.items()}
        proc = None
        try:
            for loop in loops.values():  # warm-up, unmeasured: a pass over the data each
                loop.wait_ready()
            trees = {name: ProcessTree(loop.proc.pid) for name, loop in loops.items()}
            for tree in trees.values():
                tree.pause()
            proc = run_job(mlp, cmd, job_dir)
            wait_for_training(proc, job_dir)  # start-up alone
            log(f"flextrain is training; the sides take turns in {args.window:g}s windows until it ends")
            windows = take_turns(trees={JOB: ProcessTree(proc.pid), **trees}, order=ORDER,
                                 seconds=args.window, until=proc)
            finished = {name: loop.finish() for name, loop in loops.items()}
        finally:
            for loop in loops.values():
                loop.kill()
            if proc is not None and proc.poll() is None:
                proc.kill()
            returncode = proc.wait() if proc is not None else None
    status, times = finished_job(job_dir, cmd, returncode, job_output(job_dir))
    if len(times) != len(sizes):
        raise SystemExit(f"flextrain recorded {len(times)} optimizer steps, expected {len(sizes)}")
    series = {JOB: StepSeries(times, sizes), **{name: s for name, (s, _) in finished.items()}}
    rated = rated_windows(windows, series, min_steps=args.min_window_steps)
    ratios = {key: paired_ratios(rated, side=side, base=base) for key, (side, base) in PAIRS.items()}
    if min(len(r) for r in ratios.values()) < 10:
        raise SystemExit(f"only {min(len(r) for r in ratios.values())} paired windows: run more --epochs")
    intervals = {side: step_intervals(s, windows, side=side) for side, s in series.items()}
    other = None if meter.other_cores is None else round(meter.other_cores, 3)
    if other is not None and other > args.max_other_cpu:
        log(f"WARNING: other processes used {other:.2f} cores meanwhile; numbers are noisy")
    return {
        "ratios": ratios,
        "rate": {side: statistics.median(r["rate"] for r in rated if r["side"] == side) for side in series},
        "detail": {
            **summary([ratios]),
            "pairs": {key: len(r) for key, r in ratios.items()},
            "windows": {side: sum(r["side"] == side for r in rated) for side in series},
            "windows_dropped": len(windows) - len(rated),
            "median_steps_per_window": {side: statistics.median(r["steps"] for r in rated if r["side"] == side)
                                        for side in series},
            # median and mean step inside the windows: a gap between them is a tail of slow steps
            "step_ms": {side: {"median": round(1e3 * statistics.median(v), 3),
                               "mean": round(1e3 * statistics.fmean(v), 3)} for side, v in intervals.items()},
            # median 1st, 2nd, 3rd step interval in a window, then the rest: the cost of resuming
            "step_ms_by_position": {side: [round(1e3 * x, 3) for x in intervals_by_position(s, windows, side=side)]
                                    for side, s in series.items()},
            "paired_ratios": [round(x, 3) for x in ratios["ratio"]],  # in time order
            "paired_ratios_vs_memory": [round(x, 3) for x in ratios["ratio_vs_memory"]],
            "other_cpu_cores": other,
            "waited_for_quiet_s": round(waited, 1),
            "job_steps": status.get("step"),
            "mean_loss": {name: loss for name, (_, loss) in finished.items()},
        },
    }


def summary(runs: list[dict[str, list[float]]]) -> dict:
    """Each paired ratio's median and ``_ci95`` over the ratios of ``runs`` pooled."""
    out = {}
    for key in PAIRS:
        groups = [run[key] for run in runs]
        out[key] = round(statistics.median([x for g in groups for x in g]), 4)
        out[f"{key}_ci95"] = [round(x, 4) for x in pooled_median_ci(groups)]
    return out


def measure(args, mlp, files: list[str], *, data_dir: Path, root: Path, sizes: list[int]) -> dict:
    """The result fields of the interleaved method (see ``overhead.py``)."""
    runs = []
    for r in range(args.repeats):
        if args.repeats > 1:
            log(f"run {r + 1} of {args.repeats}")
        runs.append(one_run(args, mlp, files, data_dir=data_dir, root=root, sizes=sizes))
        d = runs[-1]["detail"]
        log(f"  ratio (vs stream) {d['ratio']} {d['ratio_ci95']}, vs memory {d['ratio_vs_memory']}, "
            f"control vs memory {d['control_vs_memory']}")
    pooled = summary([run["ratios"] for run in runs])
    rate = {side: statistics.median(run["rate"][side] for run in runs) for side in runs[0]["rate"]}
    return {
        "memory_samples_per_s": round(rate["memory"], 1),
        "stream_samples_per_s": round(rate["stream"], 1),
        "checked_samples_per_s": round(rate["checked"], 1),
        "flextrain_samples_per_s": round(rate[JOB], 1),
        **pooled,
        "meets_target_at_ci95_lower_bound": pooled["ratio_ci95"][0] >= args.target_ratio,
        "per_run_ratio": [run["detail"]["ratio"] for run in runs],
        "per_run_ratio_vs_memory": [run["detail"]["ratio_vs_memory"] for run in runs],
        "per_run_control_vs_memory": [run["detail"]["control_vs_memory"] for run in runs],
        "repeats": args.repeats,
        "epochs": args.epochs,
        "steps": len(sizes),
        "method": METHOD,
        "runs": {"window_seconds": args.window, "per_run": [run["detail"] for run in runs]},
    }
