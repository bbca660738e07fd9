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
