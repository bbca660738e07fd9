"""flextrain/worker/probing.py in-process: the worker's probe on the digits module, its cache, and the
error when not even one sample fits (the e2e side is tests/e2e/test_auto_micro_batch.py)."""

from __future__ import annotations

import json

import pytest
import torch

from ft_helpers import DIGITS_MODEL
from flextrain.job import JobSpec
from flextrain.worker.module import load_model_def
from flextrain.worker.probing import MicroBatchProbeError, cache_path, probe_worker, upper_bound


def built(digits_data, tmp_path, **settings):
    spec = JobSpec.of(name="p", model_def=DIGITS_MODEL, training_data=str(digits_data / "train"),
                      job_dir=str(tmp_path), max_micro_batch="auto", **settings).validate()
    md = load_model_def(spec.model_def)
    torch.manual_seed(0)
    model = md.build_model()
    return spec, md, model, md.build_optimizer(model, None)


def test_the_probe_leaves_the_model_as_it_was_and_caches_its_answer(digits_data, tmp_path):
    spec, md, model, optimizer = built(digits_data, tmp_path, memory_limit="100KB", global_batch_size=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = probe_worker(spec, md, model, optimizer)
    assert 1 <= probe.max_micro_batch <= 32 and probe.memory_limit == 100_000 and not probe.cached
    assert probe.device == "cpu" and 0 < probe.peak_bytes <= 100_000
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not optimizer.state
    (entry,) = json.loads(cache_path(spec).read_text()).values()
    assert (entry["size"], entry["limit"]) == (probe.max_micro_batch, 100_000)
    again = probe_worker(spec, md, model, optimizer)  # as a relaunched worker would
    assert again.cached and again.max_micro_batch == probe.max_micro_batch


def test_not_even_one_sample_fitting_names_the_limit(digits_data, tmp_path):
    spec, md, model, optimizer = built(digits_data, tmp_path, memory_limit="1KB")
    with pytest.raises(MicroBatchProbeError, match=r"--max-micro-batch auto: micro-batch 1 does not fit .* "
                                                   r"\(--memory-limit 1KB\)"):
        probe_worker(spec, md, model, optimizer)


def test_the_upper_bound_is_the_largest_global_batch():
    spec = JobSpec.of(name="p", model_def="m.py:M", training_data="d", job_dir="/j", global_batch_size=32)
    assert upper_bound(spec) == 32
    adaptive = spec.replace(batch_schedule="adaptive", min_global_batch=16, max_global_batch=256, lr_rule="adascale")
    assert upper_bound(adaptive) == 256


def test_a_memory_sample_travels_as_the_heartbeat_carries_it():
    from flextrain.worker.state import memory_sample

    cpu = memory_sample({"step": 3, "rss": 100, "peak_rss": 150}, torch.device("cpu"))
    assert (cpu.step, cpu.device, cpu.used_bytes, cpu.peak_bytes, cpu.reserved_bytes) == (3, "cpu", 100, 150, 0)
    gpu = memory_sample({"step": 4, "allocated": 10, "peak": 20, "reserved": 30}, torch.device("cuda", 0))
    assert (gpu.device, gpu.used_bytes, gpu.peak_bytes, gpu.reserved_bytes) == ("cuda:0", 10, 20, 30)


def test_memory_is_sampled_when_a_heartbeat_asks_once_a_step_was_trained():
    from flextrain.elastic.memory import MemoryMonitor
    from flextrain.worker.state import WorkerState

    state = WorkerState(monitor=MemoryMonitor(device=torch.device("cpu"), keep=10))
    assert state.sample_memory() is None and not state.monitor.history  # nothing trained yet: no sample
    state.version = 7
    sample = state.sample_memory()  # sampled now, at the heartbeat, with the version trained so far
    assert (sample.step, sample.device) == (7, "cpu") and 0 < sample.used_bytes <= sample.peak_bytes
    assert [e["step"] for e in state.monitor.history] == [7]
