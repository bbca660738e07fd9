"""``bench/overhead.py --method runs``: whole runs of each side, one after another, repeated.

Each repeat runs every side once (they take turns to go first) for the same ``--epochs``;
a side's throughput is the samples of steps 2..N over the time from the end of step 1 to
the end of step N, so process start-up and the first (warm-up) step are outside and
everything else, one-off costs such as each file's first decode included, is inside.
On this 2-core VM single runs of the same side vary by 10-15%, so this method needs
many repeats and still cannot resolve a few percent; ``--method interleaved`` can.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from machine import CPUMeter, log, wait_until_quiet
from overhead_sides import PlainLoop, final_weights, finished_job, job_command, run_job, job_output

METHOD = (
    "runs: each side runs the whole job (--epochs) once per repeat, the sides taking turns to go first; "
    "samples/s = samples of steps 2..N / (t_N - t_1) from post-step timestamps (start-up and the first "
    "step's warm-up excluded, the first decode of each file included); ratio = median flextrain run / "
    "median stream run, ratio_vs_memory likewise. The stream loop's reader cache is cleared first, so "
    "every chunk is decoded once, as in a new worker. A run during which other processes used more than "
    "max_other_cpu cores is discarded and repeated."
)


def summarize(step_times: list[float], sizes: list[int]) -> dict:
    """Throughput over steps 2..N from post-step timestamps, plus per-step interval stats."""
    if len(step_times) != len(sizes):
        raise SystemExit(f"recorded {len(step_times)} optimizer steps, expected {len(sizes)}")
    t = np.asarray(step_times)
    dt = np.diff(t)
    window = float(t[-1] - t[0])
    samples = int(sum(sizes[1:]))
    return {
        "samples_per_s": samples / window,
        "window_seconds": round(window, 4),
        "window_samples": samples,
        "step_ms_mean": round(1e3 * float(dt.mean()), 3),
        "step_ms_median": round(1e3 * float(np.median(dt)), 3),
        "step_ms_p90": round(1e3 * float(np.percentile(dt, 90)), 3),
        "step_ms_max": round(1e3 * float(dt.max()), 3),
    }


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def plain_run(mlp, files, *, steps: int, batch: int, seed: int, lr, stream: bool) -> dict:
    from flextrain.data import clear_reader_cache

    clear_reader_cache()  # decode every chunk afresh, like flextrain's new worker process
    loop = PlainLoop(mlp, files, batch=batch, seed=seed, lr=lr, stream=stream)
    for _ in range(steps):
        loop.step()
    return {"step_times": loop.series.times, "model": loop.model, "extra": {"mean_loss": loop.mean_loss}}


def flextrain_run(mlp, data_dir, job_dir, *, batch: int, epochs: int, seed: int, lr, extra=()) -> dict:
    cmd = job_command(data_dir, job_dir, batch=batch, epochs=epochs, seed=seed, lr=lr, extra=extra)
    t0 = time.perf_counter()
    proc = run_job(mlp, cmd, job_dir)
    returncode = proc.wait()
    seconds = time.perf_counter() - t0
    status, times = finished_job(job_dir, cmd, returncode, job_output(job_dir))
    return {"step_times": times, "extra": {"job_seconds": round(seconds, 3), "job_steps": status.get("step"),
                                           "last_loss": status.get("metrics", {}).get("loss")}}


def measure(args, mlp, files: list[str], *, data_dir, root, sizes: list[int]) -> dict:
    """The result fields of the runs method (see ``overhead.py``)."""
    G = args.global_batch_size
    epochs = args.epochs
    for stream in (False, True):  # warm-up, discarded
        plain_run(mlp, files, steps=len(sizes) // epochs, batch=G, seed=args.seed, lr=args.lr, stream=stream)
    started = time.perf_counter()

    def plain(stream: bool):
        return lambda: plain_run(mlp, files, steps=len(sizes), batch=G, seed=args.seed, lr=args.lr, stream=stream)

    def run_flextrain():
        return flextrain_run(mlp, data_dir, root / "job", batch=G, epochs=epochs, seed=args.seed, lr=args.lr,
                             extra=args.job_arg)

    sides = (("stream", plain(True)), ("flextrain", run_flextrain), ("memory", plain(False)))
    runs = {name: [] for name, _ in sides} | {"discarded": []}
    kept_busy = 0
    last = {}
    for r in range(args.repeats):
        for name, fn in sides[r % 3:] + sides[: r % 3]:  # rotate who goes first
            for attempt in range(args.retries + 1):
                over_budget = time.perf_counter() - started > args.max_seconds
                waited = 0.0 if over_budget else wait_until_quiet(args.max_other_cpu, args.quiet_wait)
                with CPUMeter() as meter:
                    res = fn()
                rec = {"repeat": r, **summarize(res["step_times"], sizes), **res["extra"],
                       "other_cpu_cores": None if meter.other_cores is None else round(meter.other_cores, 3),
                       "attempt": attempt, "waited_for_quiet_s": round(waited, 1)}
                busy = meter.other_cores is not None and meter.other_cores > args.max_other_cpu
                log(f"repeat {r} {name:<9} {rec['samples_per_s']:8.0f} samples/s  step ms: mean "
                    f"{rec['step_ms_mean']:.2f} median {rec['step_ms_median']:.2f} p90 {rec['step_ms_p90']:.2f} "
                    f"max {rec['step_ms_max']:.1f}"
                    + (f"  [other processes used {meter.other_cores:.2f} cores]" if busy else ""))
                if not busy:
                    break
                if attempt < args.retries and not over_budget:
                    runs["discarded"].append({"side": name, **rec})
                    log("  ... disturbed: discarding and repeating this run")
                else:
                    kept_busy += 1
                    rec["disturbed"] = True
            rec["samples_per_s"] = round(rec["samples_per_s"], 1)
            runs[name].append(rec)
            last[name] = res

    speed = {name: median(x["samples_per_s"] for x in runs[name]) for name, _ in sides}
    best = {name: max(x["samples_per_s"] for x in runs[name]) for name, _ in sides}

    def paired(base: str) -> list[float]:
        return [f["samples_per_s"] / b["samples_per_s"] for b, f in zip(runs[base], runs["flextrain"])]

    ft = final_weights(root / "job")
    summary = {
        "per_repeat_ratios_vs_stream": [round(x, 4) for x in paired("stream")],
        "per_repeat_ratios_vs_memory": [round(x, 4) for x in paired("memory")],
        "median_of_per_repeat_ratios_vs_stream": round(median(paired("stream")), 4),
        "median_of_per_repeat_ratios_vs_memory": round(median(paired("memory")), 4),
        "best_run_ratio_vs_stream": round(best["flextrain"] / best["stream"], 4),
        "best_run_ratio_vs_memory": round(best["flextrain"] / best["memory"], 4),
        "best_samples_per_s": best,
        "median_step_ms": {name: median(x["step_ms_median"] for x in runs[name]) for name, _ in sides},
        "kept_disturbed_runs": kept_busy,
        # Same model, data, order, seed and step count: the final weights should agree.
        "final_weights_max_abs_diff": max(
            float((ft[k] - v).abs().max()) for name in ("stream", "memory")
            for k, v in last[name]["model"].state_dict().items()),
    }
    if kept_busy:
        log(f"WARNING: {kept_busy} kept runs shared the CPU with other processes; numbers are noisy")
    return {
        "memory_samples_per_s": round(speed["memory"], 1),
        "stream_samples_per_s": round(speed["stream"], 1),
        "flextrain_samples_per_s": round(speed["flextrain"], 1),
        "ratio": round(speed["flextrain"] / speed["stream"], 4),
        "ratio_vs_memory": round(speed["flextrain"] / speed["memory"], 4),
        "epochs": epochs,
        "steps": len(sizes),
        "timed_steps": len(sizes) - 1,
        "repeats": args.repeats,
        "method": METHOD,
        "runs": {**summary, **runs},
    }
