"""Batch-size traces and LR rules: what is read, what holds past the end, and every bad trace named by line."""

from __future__ import annotations

import math

import pytest

from flextrain.elastic.schedule import BatchSchedule, LRRule, ScheduleError, lr_factor


def test_a_csv_trace_is_read_by_step_and_the_last_size_holds(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("step,batchsize\n0, 128\n1, 128\n2, 256\n")
    s = BatchSchedule.of(path)
    assert s.sizes == (128, 128, 256) and s.length == 3
    assert [s.global_batch(i) for i in range(5)] == [128, 128, 256, 256, 256]
    assert s.steps_for(128 + 128 + 256 + 1) == 4


def test_lists_and_ints_are_traces_too():
    assert BatchSchedule.of([64, 128]).sizes == (64, 128)
    assert BatchSchedule.of(32).global_batch(1000) == 32


@pytest.mark.parametrize("text, named", [
    ("", "empty"),
    ("\n\n", "empty"),
    ("0,128\n1,128\n", "line 1: the header must be 'step,batchsize'"),
    ("step,batchsize\n", "only a header"),
    ("step,batchsize\n0,128\n1,abc\n", "line 3: batchsize: 'abc' is not an integer"),
    ("step,batchsize\n0,128\n1,-64\n", "line 3: a batch size must be positive, got -64"),
    ("step,batchsize\n0,0\n", "line 2: a batch size must be positive, got 0"),
    ("step,batchsize\n0,128\n2,128\n", "line 3: step 2 out of order: expected step 1"),
    ("step,batchsize\n1,128\n", "line 2: step 1 out of order: expected step 0"),
    ("step,batchsize\n0,128,7\n", "line 2: expected 'step,batchsize'"),
    ("step,batchsize\nx,128\n", "line 2: step: 'x' is not an integer"),
])
def test_a_bad_trace_is_named_by_line(text, named):
    with pytest.raises(ScheduleError) as info:
        BatchSchedule.parse(text, source="trace.csv")
    assert str(info.value).startswith("trace.csv: ") and named in str(info.value), str(info.value)


def test_a_size_that_is_not_a_multiple_names_the_step():
    with pytest.raises(ScheduleError, match=r"step 1: batch size 100 is not a multiple of minibatch x replicas \(64\)"):
        BatchSchedule.of([128, 100]).check_multiple_of(64, what="minibatch x replicas")


def test_an_unreadable_trace_names_the_file(tmp_path):
    with pytest.raises(ScheduleError, match="cannot read the batch-size trace .*missing.csv"):
        BatchSchedule.of(tmp_path / "missing.csv")


@pytest.mark.parametrize("bad", [True, 0, -3, 2.5, {"a": 1}])
def test_not_a_trace(bad):
    with pytest.raises(ScheduleError):
        BatchSchedule.of(bad)


def test_the_rules():
    assert lr_factor("linear", 512, 128) == 4.0
    assert lr_factor(LRRule.SQRT, 512, 128) == 2.0
    assert lr_factor("none", 512, 128) == 1.0
    assert math.isclose(lr_factor("sqrt", 64, 128), math.sqrt(0.5))
    with pytest.raises(ScheduleError, match="gain measured"):
        lr_factor("adascale", 512, 128)
    with pytest.raises(ValueError):
        lr_factor("cubic", 512, 128)
