"""StepLoader: prefetched spans are used only when asked for, errors surface on use."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from flextrain.worker.prefetch import StepLoader


class Loads:
    def __init__(self, fail_on: tuple[int, int] | None = None):
        self.calls: list[tuple[int, int, int, str]] = []
        self.fail_on = fail_on

    def __call__(self, task, start, end):
        self.calls.append((task.task_id, start, end, threading.current_thread().name))
        if (start, end) == self.fail_on:
            raise ValueError(f"bad record in [{start}, {end})")
        return f"{task.task_id}:{start}-{end}"


TASK = SimpleNamespace(task_id=7)


def test_prefetched_span_is_loaded_once_in_the_background():
    loads = Loads()
    loader = StepLoader(loads)
    loader.prefetch(TASK, 10, 20)
    assert loader.get(TASK, 10, 20) == "7:10-20"
    assert len(loads.calls) == 1 and loads.calls[0][3].startswith("flextrain-prefetch")
    loader.close()


def test_a_different_span_is_loaded_now_and_the_prefetch_dropped():
    loads = Loads()
    loader = StepLoader(loads)
    loader.prefetch(TASK, 10, 20)  # e.g. planned for a world size that changed
    assert loader.get(TASK, 10, 15) == "7:10-15"
    assert loads.calls[-1][:3] == (7, 10, 15) and loads.calls[-1][3] == threading.current_thread().name
    assert loader.get(TASK, 10, 20) == "7:10-20"  # nothing stale is served later
    loader.close()


def test_a_load_error_surfaces_when_the_span_is_used():
    loader = StepLoader(Loads(fail_on=(0, 5)))
    loader.prefetch(TASK, 0, 5)
    with pytest.raises(ValueError, match=r"bad record in \[0, 5\)"):
        loader.get(TASK, 0, 5)
    loader.close()


def test_read_ahead_only_with_a_core_to_spare(monkeypatch):
    """The environment decides if set; else a CPU-only process reads ahead only when it may use
    more cores than torch's threads."""
    import os

    import torch

    from flextrain.worker.prefetch import read_ahead_wanted

    monkeypatch.setenv("FLEXTRAIN_READ_AHEAD", "0")
    assert read_ahead_wanted() is False
    monkeypatch.setenv("FLEXTRAIN_READ_AHEAD", "1")
    assert read_ahead_wanted() is True
    monkeypatch.delenv("FLEXTRAIN_READ_AHEAD")
    if torch.cuda.is_available():
        assert read_ahead_wanted() is True
        return
    cores, before = len(os.sched_getaffinity(0)), torch.get_num_threads()
    try:
        torch.set_num_threads(cores)
        assert read_ahead_wanted() is False
        if cores > 1:
            torch.set_num_threads(cores - 1)
            assert read_ahead_wanted() is True
    finally:
        torch.set_num_threads(before)


def test_without_a_background_thread_every_span_loads_on_the_spot():
    loads = Loads()
    loader = StepLoader(loads, background=False)
    loader.prefetch(TASK, 10, 20)  # ignored
    assert loads.calls == []
    assert loader.get(TASK, 10, 20) == "7:10-20"
    assert [c[3] for c in loads.calls] == [threading.current_thread().name]
    assert (loader.ahead, loader.now) == (0, 1)
    loader.close()


def test_a_span_loaded_ahead_in_the_calling_thread_serves_the_next_get():
    """load_ahead (a collective's wait) loads now, in this thread, even without a loader thread."""
    loads = Loads()
    loader = StepLoader(loads, background=False)
    loader.load_ahead(TASK, 10, 20)
    assert [c[3] for c in loads.calls] == [threading.current_thread().name]
    assert loader.get(TASK, 10, 20) == "7:10-20"
    assert len(loads.calls) == 1 and (loader.ahead, loader.now) == (1, 0)
    loader.load_ahead(TASK, 20, 30)  # the round ended: the next step asks for another span
    assert loader.get(TASK, 20, 25) == "7:20-25" and (loader.ahead, loader.now) == (1, 1)
    assert loader.get(TASK, 20, 30) == "7:20-30"  # loaded again: nothing stale is kept
    loader.close()


def test_an_error_loading_ahead_surfaces_when_the_span_is_used():
    loader = StepLoader(Loads(fail_on=(0, 5)), background=False)
    loader.load_ahead(TASK, 0, 5)  # does not raise here: this step's sums are still in flight
    with pytest.raises(ValueError, match=r"bad record in \[0, 5\)"):
        loader.get(TASK, 0, 5)
    loader.close()


def test_local_workers_are_told_whether_a_core_is_left_for_reading_ahead(monkeypatch):
    from flextrain.master.main import read_ahead_env

    monkeypatch.delenv("FLEXTRAIN_READ_AHEAD", raising=False)
    # every core claimed by the workers' torch threads (cores // workers each): no thread
    assert read_ahead_env(cores=2, threads=2, workers=1, gpu=False) == {"FLEXTRAIN_READ_AHEAD": "0"}
    assert read_ahead_env(cores=16, threads=8, workers=2, gpu=False) == {"FLEXTRAIN_READ_AHEAD": "0"}
    assert read_ahead_env(cores=5, threads=2, workers=2, gpu=False) == {"FLEXTRAIN_READ_AHEAD": "0"}
    # a core left for each worker, or a GPU computing: the worker's own rule decides
    assert read_ahead_env(cores=8, threads=3, workers=2, gpu=False) == {}
    assert read_ahead_env(cores=2, threads=2, workers=1, gpu=True) == {}
    monkeypatch.setenv("FLEXTRAIN_READ_AHEAD", "1")  # the user's choice is passed on untouched
    assert read_ahead_env(cores=2, threads=2, workers=1, gpu=False) == {}
