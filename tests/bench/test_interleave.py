"""bench/interleave.py and bench/machine.py: the overhead bench's interleaved timing.

The statistics are checked on series with known rates; the pausing on real processes:
a job's own clock readings must never fall inside the windows it was stopped for.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from interleave import (JOB, StepSeries, Window, intervals_by_position, median_ci, paired_ratios,  # noqa: E402
                        pooled_median_ci, rated_windows, take_turns)
from machine import ProcessTree, descendants  # noqa: E402


def steady(t0: float, t1: float, rate: float, batch: int = 10) -> StepSeries:
    """Steps of ``batch`` samples ending every ``batch / rate`` seconds from ``t0`` to ``t1``."""
    dt = batch / rate
    times = [t0 + k * dt for k in range(int((t1 - t0) / dt) + 1)]
    return StepSeries(times, [batch] * len(times))


def test_window_rate_counts_from_the_end_of_the_first_step_inside():
    # 100 samples/s, but the window opens 0.05 s after a step: the straddling step is left out.
    series = StepSeries([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], [10] * 6)
    [rated] = rated_windows([Window(JOB, 0.15, 0.45)], {JOB: series}, min_steps=2)
    assert rated["steps"] == 3  # ends at 0.2, 0.3, 0.4
    assert rated["rate"] == pytest.approx(20 / 0.2)


def test_window_with_too_few_steps_is_dropped():
    series = StepSeries([0.0, 0.1, 0.2], [10] * 3)
    assert rated_windows([Window(JOB, 0.05, 0.25)], {JOB: series}, min_steps=3) == []


def test_intervals_by_position_show_a_slow_first_step_after_each_resume():
    # two windows of the job; in each, the first interval inside is 30 ms, the second 15, the rest 10
    times = []
    for start in (0.0, 1.0):
        t = start
        for dt in (0.01, 0.03, 0.015, 0.01, 0.01, 0.01, 0.01):
            t += dt
            times.append(t)
    series = StepSeries(times, [10] * len(times))
    windows = [Window(JOB, 0.005, 0.5), Window("memory", 0.5, 1.0), Window(JOB, 1.005, 1.5)]
    by_position = intervals_by_position(series, windows, side=JOB, first=2)
    assert by_position == pytest.approx([0.03, 0.015, 0.01])
    assert all(math.isnan(x) for x in intervals_by_position(series, windows, side="stream", first=2))


def test_paired_ratios_cancel_a_linear_drift():
    # The machine slows down linearly; the job always runs at 90% of the baseline's speed then.
    # Comparing with the nearest baseline window alone would be off by the drift.
    def speed(t):
        return 1000.0 - 20.0 * t

    windows, series = [], {JOB: StepSeries([], []), "base": StepSeries([], [])}
    t = 0.0
    for k in range(12):
        side = JOB if k % 2 else "base"
        mid = t + 0.5
        part = steady(t, t + 1.0, (0.9 if side == JOB else 1.0) * speed(mid))
        series[side].times.extend(part.times)
        series[side].samples.extend(part.samples)
        windows.append(Window(side, t - 1e-9, t + 1.0 + 1e-9))
        t += 1.0
    rated = rated_windows(windows, series, min_steps=5)
    ratios = paired_ratios(rated, side=JOB, base="base")
    assert len(ratios) == 5  # the last job window has no baseline window after it
    assert ratios == pytest.approx([0.9] * 5, rel=0.01)
    nearest = [r["rate"] / rated[i - 1]["rate"] for i, r in enumerate(rated) if r["side"] == JOB]
    assert min(nearest) < 0.89  # what the interpolation corrects


def test_median_ci_brackets_the_median_and_is_reproducible():
    values = [0.9 + 0.01 * ((7 * k) % 11) for k in range(40)]
    lo, hi = median_ci(values)
    assert lo <= sorted(values)[20] <= hi
    assert (lo, hi) == median_ci(values)
    assert hi - lo < max(values) - min(values)


def test_pooled_median_ci_widens_when_runs_disagree():
    # three runs whose windows agree closely within each run but whose levels differ by 4%
    runs = [[level + 0.001 * ((5 * k) % 7) for k in range(100)] for level in (0.95, 0.97, 0.99)]
    pooled = [x for run in runs for x in run]
    lo, hi = pooled_median_ci(runs)
    assert lo <= sorted(pooled)[150] <= hi
    assert (lo, hi) == pooled_median_ci(runs)
    naive_lo, naive_hi = median_ci(pooled)  # as if the 300 windows were one run
    assert hi - lo > 3 * (naive_hi - naive_lo)
    assert lo < 0.96 and hi > 0.98  # the run-to-run spread is in the interval
    assert pooled_median_ci(runs[:1]) == median_ci(runs[0])


CLOCK_JOB = textwrap.dedent("""
    import json, os, subprocess, sys, time
    # a grandchild in a session of its own, like flextrain's worker
    child = subprocess.Popen(  # it leaves as soon as this process is gone, even if killed
        [sys.executable, "-c", "import os, sys, time\\nwhile os.getppid() == int(sys.argv[1]): time.sleep(0.05)",
         str(os.getpid())], start_new_session=True)
    print(child.pid, flush=True)
    times = []
    for _ in range(1500):  # ~1.5 s of its own running time, however long it is stopped
        time.sleep(0.001)
        times.append(time.perf_counter())
    child.kill()
    child.wait()
    json.dump(times, open(sys.argv[1], "w"))
""")


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_for_state(pid: int, wanted: set[str], timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while (s := state(pid)) not in wanted and time.monotonic() < deadline:
        time.sleep(0.005)
    return s


def test_process_tree_pauses_and_resumes_every_descendant(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", CLOCK_JOB, str(tmp_path / "t.json")], stdout=subprocess.PIPE,
                            text=True)
    try:
        grandchild = int(proc.stdout.readline())
        assert grandchild in descendants(proc.pid)
        tree = ProcessTree(proc.pid)
        tree.pause()
        assert {wait_for_state(proc.pid, {"T"}), wait_for_state(grandchild, {"T"})} == {"T"}
        tree.resume()
        assert wait_for_state(proc.pid, {"S", "R"}) in {"S", "R"}
        assert wait_for_state(grandchild, {"S", "R"}) in {"S", "R"}
    finally:
        proc.kill()
        proc.wait()


CLOCK_LOOP = textwrap.dedent("""
    import json, signal, sys, time
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    times = []
    while not stop:
        time.sleep(0.001)
        times.append(time.perf_counter())
    json.dump(times, open(sys.argv[1], "w"))
""")


def test_take_turns_never_lets_a_side_run_in_another_sides_window(tmp_path):
    job_out, loop_out = tmp_path / "job.json", tmp_path / "loop.json"
    proc = subprocess.Popen([sys.executable, "-c", CLOCK_JOB, str(job_out)], stdout=subprocess.PIPE, text=True)
    loop = subprocess.Popen([sys.executable, "-c", CLOCK_LOOP, str(loop_out)])
    try:
        grandchild = int(proc.stdout.readline())
        windows = take_turns(trees={JOB: ProcessTree(proc.pid), "loop": ProcessTree(loop.pid)},
                             order=[JOB, "loop"], seconds=0.1, until=proc)
        assert proc.wait() == 0
        loop.terminate()
        assert loop.wait(timeout=10) == 0
    finally:
        for p in (proc, loop):
            p.kill()
            p.wait()
    job_times, loop_times = json.loads(job_out.read_text()), json.loads(loop_out.read_text())
    assert len(job_times) == 1500
    loop_windows = [w for w in windows if w.side == "loop"]
    assert len(loop_windows) >= 5
    for w in loop_windows:
        assert not [t for t in job_times if w.start < t < w.end], f"the job ran during {w}"
        assert [t for t in loop_times if w.start < t < w.end], f"the loop did not run during {w}"
    for w in windows:
        if w.side == JOB:
            assert not [t for t in loop_times if w.start < t < w.end], f"the loop ran during {w}"
    # from the first window to the job's end, each side ran only inside its own windows
    assert all(any(w.start < t <= w.end for w in windows if w.side == JOB)
               for t in job_times if t > windows[0].start)
    assert all(any(w.start < t <= w.end for w in loop_windows)
               for t in loop_times if windows[0].start < t < windows[-1].end)
    with pytest.raises(ProcessLookupError):
        os.kill(grandchild, 0)


TERMINATED_BENCH = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from interleave import take_turns
from machine import ProcessTree
job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
side = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(job.pid, side.pid, flush=True)
take_turns(trees={"job": ProcessTree(job.pid), "side": ProcessTree(side.pid)}, order=["job", "side"],
           seconds=0.05, until=job)
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_terminated_bench_leaves_no_side_stopped():
    bench = subprocess.Popen([sys.executable, "-c", TERMINATED_BENCH, str(BENCH)], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in bench.stdout.readline().split()]
    try:
        deadline = time.monotonic() + 60
        while "T" not in [_state(pid) for pid in pids]:  # the turns have begun (the handler is set before)
            assert time.monotonic() < deadline and bench.poll() is None
            time.sleep(0.01)
        bench.terminate()  # what `timeout` sends, mid-turns
        assert bench.wait(timeout=60) == 128 + 15
        # resumed: not "T" (stopped); "R" as well as "S" (a loaded machine may still be starting them)
        assert [s for s in (_state(pid) for pid in pids) if s in "Tt"] == []
    finally:
        for pid in pids:
            os.kill(pid, 9)
