"""Interleaved timing: the sides of a comparison, each a process, take turns in short windows.

Why: on a shared 2-core VM the speed of the *same* loop drifts by 10-15% from one
run to the next and by ~8% between neighbouring seconds (hypervisor steal, host
contention), so whole runs timed one after another cannot resolve a 3% overhead.
Here every side (the flextrain job with all its processes, each plain loop) runs
only inside its own windows and is SIGSTOP-ed outside them. Windows are short
(0.5 s by default) and alternate, so each job window is compared with baseline
windows a second or two away, and the drift mostly cancels; the median over ~100
such pairs has a bootstrap confidence interval of about +-1.5%.

Every side is a paused process, so every side pays what resuming costs (cold
caches, threads waking): a baseline run inside the bench process paid none of it,
and an A/A check found that flattered it by 0-4% from run to run. What is left of
the method's own error shows in a control side, a second copy of a baseline.

What a window measures: every process of the job is stopped between its windows,
so nothing it does is hidden; its steady per-step cost (reading and ``feed``,
task RPCs, heartbeats, the master) is inside. The step that straddles a pause is
not counted: a window's rate runs from the end of its first step to the end of
its last. One-off costs (start-up, the first decode of each file, the final
checkpoint) fall outside the windows; ``overhead.py --method runs`` counts those.
"""

from __future__ import annotations

import bisect
import math
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass

import numpy as np

from machine import ProcessTree

JOB = "flextrain"


@dataclass(frozen=True)
class Window:
    side: str
    start: float  # time.perf_counter() (CLOCK_MONOTONIC: the same clock in every process)
    end: float
    cpu: float | None = None  # the side's CPU seconds in the window (take_turns(cpu=True)); None: unknown


@dataclass
class StepSeries:
    """Post-step timestamps and the samples of each step, in step order."""
    times: list[float]
    samples: list[int]


def take_turns(*, trees: dict[str, ProcessTree], order: list[str], seconds: float,
               until: subprocess.Popen, cpu: bool = False) -> list[Window]:
    """Each side in ``order`` in turn runs alone for ``seconds``: its process tree is resumed and
    every other one is stopped. Ends when ``until`` (the job, one of the trees' roots) exits,
    which cuts its window short. Every tree is left running. ``cpu``: each window records the CPU
    seconds its side's tree used in it (not the window in which ``until`` exits: its processes are
    gone). A SIGTERM (``timeout``'s) ends the turns as an exception, so every tree is resumed
    first: a side left stopped would never notice its parent's exit."""
    windows: list[Window] = []
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    k = 0
    try:
        for tree in trees.values():
            tree.pause()
        while until.poll() is None:
            side = order[k % len(order)]
            k += 1
            before = trees[side].cpu_seconds() if cpu else None
            t0 = time.perf_counter()
            trees[side].resume()
            try:
                until.wait(timeout=seconds)  # a paused job cannot end: this is the window's length
            except subprocess.TimeoutExpired:
                pass
            trees[side].pause()
            t1 = time.perf_counter()
            used = None
            if cpu and until.poll() is None:  # per process: one that exited in the window takes its CPU along
                after = trees[side].cpu_seconds()
                used = sum(v - before.get(pid, 0.0) for pid, v in after.items())
            windows.append(Window(side, t0, t1, used))
    finally:
        for tree in trees.values():
            tree.resume()
        signal.signal(signal.SIGTERM, previous)
    return windows


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _inside(series: StepSeries, window: Window) -> tuple[int, int]:
    """``[lo, hi)``: the steps of ``series`` that ended inside ``window``."""
    return bisect.bisect_right(series.times, window.start), bisect.bisect_right(series.times, window.end)


def cpu_per_step(series: StepSeries, windows: list[Window], *, side: str) -> float | None:
    """CPU seconds of ``side``'s tree per step it completed, over its steady windows with a CPU reading:
    a measure of the work a step costs that the neighbours' noise hardly moves (waiting is not in it).
    Steady: at least half the median window's steps; a window where the job was still starting or
    already finishing (final checkpoint, shutdown: CPU but few steps) is not a step's cost."""
    counted = []
    for w in windows:
        if w.side == side and w.cpu is not None:
            lo, hi = _inside(series, w)
            counted.append((w.cpu, hi - lo))
    if not counted:
        return None
    floor = statistics.median(n for _, n in counted) / 2
    cpu = sum(c for c, n in counted if n >= floor and n > 0)
    steps = sum(n for _, n in counted if n >= floor and n > 0)
    return cpu / steps if steps else None


def window_rate(series: StepSeries, window: Window, *, min_steps: int) -> tuple[float, int] | None:
    """``(samples/s, steps)`` over the steps that ended inside ``window``, from the end of the
    first to the end of the last; None with fewer than ``min_steps`` steps."""
    lo, hi = _inside(series, window)
    if hi - lo < max(2, min_steps):
        return None
    span = series.times[hi - 1] - series.times[lo]
    return sum(series.samples[lo + 1: hi]) / span, hi - lo


def rated_windows(windows: list[Window], series: dict[str, StepSeries], *, min_steps: int) -> list[dict]:
    """One dict per window with enough steps: side, mid-time, samples/s, steps."""
    out = []
    for w in windows:
        rated = window_rate(series[w.side], w, min_steps=min_steps)
        if rated is not None:
            out.append({"side": w.side, "t": (w.start + w.end) / 2, "rate": rated[0], "steps": rated[1]})
    return out


def _window_intervals(series: StepSeries, windows: list[Window], side: str):
    """For each of ``side``'s windows, the seconds between consecutive steps that ended inside it."""
    for w in windows:
        if w.side == side:
            lo, hi = _inside(series, w)
            yield [b - a for a, b in zip(series.times[lo:hi - 1], series.times[lo + 1:hi])]


def step_intervals(series: StepSeries, windows: list[Window], *, side: str) -> list[float]:
    """Seconds between consecutive steps that both ended inside one of ``side``'s windows."""
    return [dt for intervals in _window_intervals(series, windows, side) for dt in intervals]


def intervals_by_position(series: StepSeries, windows: list[Window], *, side: str, first: int = 3) -> list[float]:
    """Median seconds of the 1st, 2nd, ... ``first``-th step interval inside ``side``'s windows,
    then of all later ones: what resuming after the other sides' windows costs this side."""
    at: list[list[float]] = [[] for _ in range(first + 1)]
    for intervals in _window_intervals(series, windows, side):
        for k, dt in enumerate(intervals):
            at[min(k, first)].append(dt)
    return [statistics.median(v) if v else math.nan for v in at]


def paired_ratios(rated: list[dict], *, side: str, base: str) -> list[float]:
    """``side``'s rate in each of its windows over ``base``'s rate at the same moment, linearly
    interpolated between the nearest ``base`` windows before and after (drift cancels to first
    order). Windows without a ``base`` window on both sides are left out."""
    base_t = [r["t"] for r in rated if r["side"] == base]
    base_rate = [r["rate"] for r in rated if r["side"] == base]
    ratios = []
    for r in rated:
        if r["side"] != side:
            continue
        i = bisect.bisect_left(base_t, r["t"])
        if i == 0 or i == len(base_t):
            continue
        (ta, ra), (tb, rb) = (base_t[i - 1], base_rate[i - 1]), (base_t[i], base_rate[i])
        ratios.append(r["rate"] / (ra + (rb - ra) * (r["t"] - ta) / (tb - ta)))
    return ratios


def median_ci(values: list[float], *, level: float = 0.95, resamples: int = 4000,
              seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median (seeded: the same data gives the
    same interval)."""
    v = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    return _percentiles(np.median(rng.choice(v, size=(resamples, len(v)), replace=True), axis=1), level)


def _percentiles(medians: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` interval of bootstrapped medians."""
    tail = 100 * (1 - level) / 2
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def pooled_median_ci(groups: list[list[float]], *, level: float = 0.95, resamples: int = 4000,
                     seed: int = 0) -> tuple[float, float]:
    """Confidence interval of the median of all ``groups`` pooled, by a two-level bootstrap:
    resample the groups (runs), then the values within each. Runs of the same bench can differ
    by more than their own intervals say; resampling whole runs carries that into the interval.
    With one group it is :func:`median_ci`'s interval."""
    if len(groups) == 1:
        return median_ci(groups[0], level=level, resamples=resamples, seed=seed)
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=float) for g in groups]
    medians = np.empty(resamples)
    for k in range(resamples):
        picked = rng.integers(len(arrays), size=len(arrays))
        medians[k] = np.median(np.concatenate([rng.choice(arrays[i], size=len(arrays[i])) for i in picked]))
    return _percentiles(medians, level)
