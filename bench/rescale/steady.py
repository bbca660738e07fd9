"""Steady throughput of flextrain vs torchft, interleaved: bench/rescale's steady figure.

Both sides train the digits MLP with 3 workers/replicas at once (flextrain: ``job_cmd``, the same
job as the recovery case; torchft: three ``torchft_digits.py`` replicas and their Lighthouse) and
take turns in ``--window``-second windows (``bench/interleave.py``: the side not measured is
SIGSTOP-ed, Lighthouse and master included) for ``--steady-seconds``. A window's rate is samples/s
from the end of its first step to the end of its last (flextrain: 64 samples a step; torchft:
3 x 21 = 63, the per-replica batch it keeps); ``flextrain_vs_torchft`` is the median over
flextrain's windows of its rate / torchft's interpolated between the torchft windows around it,
with a 95% bootstrap interval. Step stamps are ``time.time()``; the windows (``perf_counter``)
are moved onto that clock by the offset measured when the turns begin.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from rescale.flextrain_case import GLOBAL_BATCH, job_cmd
from rescale.procs import Janitor, Timeout, kill_group, kill_pid, log, wait_for
from rescale.stamps import read_procs, read_steps, rnd4
from rescale.torchft_case import REPLICAS, start_group

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: interleave.py, machine.py
from interleave import StepSeries, Window, median_ci, paired_ratios, rated_windows, take_turns  # noqa: E402
from machine import ProcessTree  # noqa: E402

MIN_PAIRS = 5


class Trees:
    """Several process trees paused and resumed as one side (torchft's replicas are not one tree)."""

    def __init__(self, roots: list[int]) -> None:
        self.trees = [ProcessTree(r) for r in roots]

    def pause(self) -> None:
        for t in self.trees:
            t.pause()

    def resume(self) -> None:
        for t in self.trees:
            t.resume()


class Deadline:
    """What ``take_turns`` waits on in place of a job: it "exits" ``seconds`` after it is made."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def poll(self):
        return 0 if time.monotonic() >= self.end else None

    def wait(self, timeout: float) -> int:
        left = self.end - time.monotonic()
        time.sleep(max(0.0, min(timeout, left)))
        if left > timeout:
            raise subprocess.TimeoutExpired("steady turns", timeout)
        return 0


def longest(series: list[list[tuple[float, int]]]) -> list[float]:
    """The stamps of the member that stamped most (members step in lockstep)."""
    best = max(series, key=len, default=[])
    return [ts for ts, _ in best]


def steady_case(args, work: Path, data_dir: Path, data_pt: Path, janitor: Janitor) -> dict:
    rdir = work / "steady-ft"
    rdir.mkdir()
    master = janitor.start(job_cmd(data_dir, work / "steady-ft-job"), env=janitor.env(RESCALE_DIR=str(rdir)),
                           log_path=work / "steady-ft-master.log")
    group = None
    result: dict = {"window_s": args.window, "seconds": args.steady_seconds}
    try:
        def ft_steps():
            if master.poll() is not None:
                raise RuntimeError(f"the steady flextrain job exited with {master.returncode}")
            return [read_steps(p) for p in rdir.glob("steps-*.txt")]

        wait_for(lambda: len(longest(ft_steps())) >= 20, timeout=args.timeout, what="the steady flextrain job")
        flextrain = ProcessTree(master.pid)
        flextrain.pause()
        group = start_group(args, work, data_pt, janitor, "tf-steady")
        wait_for(lambda: len(group.live()) == REPLICAS and all(len(p["steps"]) >= 20 for p in group.live()),
                 timeout=args.timeout, what="the steady torchft replicas")
        trees = {"flextrain": flextrain,
                 "torchft": Trees([group.lighthouse.pid] + [p["pid"] for p in group.live()])}
        log(f"steady: flextrain and torchft take turns in {args.window:g}s windows for {args.steady_seconds:g}s")
        offset = time.time() - time.perf_counter()
        windows = take_turns(trees=trees, order=["flextrain", "torchft"], seconds=args.window,
                             until=Deadline(args.steady_seconds))
        windows = [Window(w.side, w.start + offset, w.end + offset) for w in windows]
        ft_times = longest(ft_steps())
        tf_times = longest([p["steps"] for p in read_procs(group.tdir)])
        series = {"flextrain": StepSeries(ft_times, [GLOBAL_BATCH] * len(ft_times)),
                  "torchft": StepSeries(tf_times, [REPLICAS * (GLOBAL_BATCH // REPLICAS)] * len(tf_times))}
        rated = rated_windows(windows, series, min_steps=3)
        ratios = paired_ratios(rated, side="flextrain", base="torchft")
        result["pairs"] = len(ratios)
        result["samples_per_s"] = {side: rnd4(statistics.median(r["rate"] for r in rated if r["side"] == side))
                                   for side in trees if any(r["side"] == side for r in rated)}
        if len(ratios) >= MIN_PAIRS:
            result["flextrain_vs_torchft"] = round(statistics.median(ratios), 4)
            result["flextrain_vs_torchft_ci95"] = [round(v, 4) for v in median_ci(ratios)]
        else:
            result["flextrain_vs_torchft"] = None
            result["error"] = f"only {len(ratios)} paired windows (need {MIN_PAIRS})"
    except (Timeout, RuntimeError) as exc:
        result["error"] = str(exc)
        log(f"steady: {exc}")
    finally:
        kill_group(master.pid)
        if group is not None:
            group.stop()
        for pid in janitor.marked_pids():
            kill_pid(pid)
    return result
