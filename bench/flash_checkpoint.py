"""Step-time cost of in-memory ("flash") checkpoints on the demo job, interleaved.

Three sides take turns in short windows (``bench/interleave.py``: each side's process tree runs
alone while every other side is SIGSTOP-ed): ``flash`` (the demo's AllReduce job, digits MLP,
``--workers 2 --global-batch-size 64 --max-micro-batch 32``, with ``--memory-checkpoint-steps N``,
default 50: rank 0 encodes its state and hands it to a background thread, which puts it into
/dev/shm, marks it with the master and writes every ``--persist-every``-th to disk), ``plain``
(the same job with ``--memory-checkpoint-steps 0``) and ``control`` (a second ``plain``: the
method's own A/A check). One torch thread per worker. Every side stamps
``time.perf_counter()`` after each optimizer step (``bench/steady/digits_models.py``); a window's
rate is steps/s from the end of its first step to the end of its last. ``flash_vs_plain`` is the
median over the flash windows of plain's rate (interpolated between its neighbouring windows) /
flash's rate, i.e. the step-time ratio (1.01 = 1% slower), with a 95% bootstrap interval;
``control_vs_plain`` likewise. The turns end when the flash job does.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ddp_steady import stamps, start, wait_steps  # noqa: E402
from interleave import StepSeries, cpu_per_step, median_ci, paired_ratios, rated_windows, take_turns  # noqa: E402
from machine import ProcessTree, descendants, log  # noqa: E402
from overhead_sides import flextrain_cmd  # noqa: E402

MODULE = HERE / "steady" / "digits_models.py"
ORDER = ["flash", "plain", "control"]


def job(args, data_dir: Path, out: Path, *, epochs: int, every: int) -> subprocess.Popen:
    cmd = flextrain_cmd() + [
        "train", "--model-def", f"{MODULE}:Model", "--training-data", str(data_dir),
        "--workers", "2", "--epochs", str(epochs), "--global-batch-size", "64", "--max-micro-batch", "32",
        "--seed", "0", "--lr", "0.1", "--no-progress", "--job-dir", str(out / "job"),
        "--memory-checkpoint-steps", str(every), "--memory-checkpoint-persist-every", str(args.persist_every)]
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=int, default=50, help="--memory-checkpoint-steps of the flash side")
    p.add_argument("--persist-every", type=int, default=4,
                   help="--memory-checkpoint-persist-every of the flash side (4: the job default)")
    p.add_argument("--epochs", type=int, default=60, help="of the flash side (its end ends the turns)")
    p.add_argument("--window", type=float, default=0.5)
    p.add_argument("--min-window-steps", type=int, default=3)
    p.add_argument("--work-dir", default=None, help="keep logs and stamps here")
    args = p.parse_args(argv)
    from flextrain.data.digits import write_digits

    root = Path(args.work_dir or tempfile.mkdtemp(prefix="flash-bench-"))
    if root.exists():
        shutil.rmtree(root)
    write_digits(root / "digits")
    data_dir = root / "digits" / "train"
    procs: dict[str, subprocess.Popen] = {}
    trees: dict[str, ProcessTree] = {}
    try:
        for side in ("plain", "control", "flash"):  # the flash side last: its end ends the turns
            epochs = args.epochs if side == "flash" else args.epochs * 3
            procs[side] = job(args, data_dir, root / side, epochs=epochs, every=args.every if side == "flash" else 0)
        # Every side trains before any is paused: a tree paused while the others start (a minute or more on
        # a loaded machine) would find its RPCs past their deadlines and its workers "hung" when resumed.
        for side in ("plain", "control", "flash"):
            wait_steps(root / side, procs[side], 10)
            trees[side] = ProcessTree(procs[side].pid)
        for side in ("plain", "control"):
            trees[side].pause()
        log(f"all sides train; they take turns in {args.window:g}s windows until the flash job ends")
        windows = take_turns(trees=trees, order=ORDER, seconds=args.window, until=procs["flash"], cpu=True)
    finally:
        for proc in procs.values():
            for pid in reversed(descendants(proc.pid)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    if procs["flash"].returncode != 0:
        raise SystemExit(f"the flash job failed ({procs['flash'].returncode}); see {root / 'flash'}")
    snapshots = len(list((root / "flash" / "job" / "checkpoints").glob("ckpt-*.ckpt")))
    series = {side: StepSeries(t := stamps(root / side), [1] * len(t)) for side in ORDER}
    rated = rated_windows(windows, series, min_steps=args.min_window_steps)
    result = {"every": args.every, "persist_every": args.persist_every, "workers": 2, "global_batch": 64, "window_s": args.window,
              "flash_steps": len(series["flash"].times), "checkpoint_files_kept": snapshots}
    for key, side in (("flash_vs_plain", "flash"), ("control_vs_plain", "control")):
        # paired_ratios: side's rate / base's rate; the step-time ratio is its inverse
        ratios = [1.0 / r for r in paired_ratios(rated, side=side, base="plain")]
        if len(ratios) < 5:
            result[key] = None
            continue
        result[key] = round(statistics.median(ratios), 4)
        result[f"{key}_ci95"] = [round(v, 4) for v in median_ci(ratios)]
        result[f"{key}_pairs"] = len(ratios)
    cpu = {side: cpu_per_step(series[side], windows, side=side) for side in ORDER}
    result["cpu_ms_per_step"] = {side: round(v * 1e3, 4) for side, v in cpu.items() if v}
    if cpu["flash"] and cpu["plain"] and cpu["control"]:
        result["cpu_flash_vs_plain"] = round(cpu["flash"] / cpu["plain"], 4)
        result["cpu_control_vs_plain"] = round(cpu["control"] / cpu["plain"], 4)
    result["snapshots"] = flash_counters(root / "flash" / "job")
    result["steps_per_s"] = {side: round(statistics.median(r["rate"] for r in rated if r["side"] == side), 2)
                             for side in ORDER if any(r["side"] == side for r in rated)}
    result["method"] = __doc__.split("\n\n")[1].replace("\n", " ")
    print(json.dumps(result))
    if not args.work_dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
