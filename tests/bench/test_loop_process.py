"""bench/plain_loop.py through overhead_sides.LoopProcess: a plain-loop side of the overhead bench.

A real loop process over real RecordIO files: it warms up, reports ready, steps on its own,
and on SIGTERM writes the clock and samples of every step it took since it was ready.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from overhead_sides import LoopProcess, load_module, write_data  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("mode", ["memory", "stream", "checked"])
def test_a_loop_process_steps_after_its_warm_up_and_reports_its_clock_on_sigterm(tmp_path, mode):
    files = write_data(tmp_path / "train", load_module(), records=600, files=2, seed=0)
    (tmp_path / f"{mode}.ready").touch()  # a previous run's files (bench --repeats) must not count
    (tmp_path / f"{mode}.json").write_text('{"times": [], "samples": [], "mean_loss": 0}')
    loop = LoopProcess(mode, files, tmp_path, name=mode, batch=128, seed=0, lr=None)
    try:
        loop.wait_ready()
        start = cpu_seconds(loop.proc.pid)
        while cpu_seconds(loop.proc.pid) - start < 0.3:  # after ready it does nothing but step
            time.sleep(0.01)
        series, mean_loss = loop.finish()
    finally:
        loop.kill()
    assert len(series.times) == len(series.samples) >= 2
    assert series.times == sorted(series.times)
    # the files hold 300 records each: batches of 128, 128 and 44 per file, in file order
    cycle = [128, 128, 44] * 2
    assert series.samples == (cycle * (len(series.samples) // 6 + 1))[:len(series.samples)]
    assert 0.0 < mean_loss < 10.0


def test_the_checked_loop_tests_its_gradients_as_a_flextrain_step_does(tmp_path):
    from overhead_sides import PlainLoop

    files = write_data(tmp_path / "train", load_module(), records=300, files=1, seed=0)
    for check in (False, True):
        loop = PlainLoop(load_module(), files, batch=64, seed=0, lr=None, stream=True, check=check)
        loop.step()
        with torch.no_grad():
            next(loop.model.parameters())[0, 0] = float("nan")  # the next step's gradients are NaN
        if check:
            with pytest.raises(FloatingPointError, match="not finite"):
                loop.step()
        else:
            loop.step()  # a plain loop applies them
