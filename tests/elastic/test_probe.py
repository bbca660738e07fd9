"""The micro-batch probe on real small models: it lands on the size a brute-force search finds, leaves
model and optimizer bit-identical, caches, and says why when nothing fits."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from flextrain.elastic.memory import format_bytes, static_bytes, step_peak
import flextrain.elastic.probe as probe_module
from flextrain.elastic.probe import ProbeError, probe_key, probe_micro_batch, training_step

N = 96  # samples the batch maker can give


class SmallCNN(nn.Module):
    """8x8 one-channel images (digits-sized), BatchNorm (running statistics to restore), dropout (RNG)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(x.flatten(1)))


def mlp():
    """For CUDA: no cuDNN, whose workspace per convolution algorithm could make peaks jump between sizes."""
    return nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10))


def make(optimizer="adam", device="cpu", kind="cnn"):
    torch.manual_seed(0)
    model = (SmallCNN() if kind == "cnn" else mlp()).to(device)
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x = torch.randn(N, 1, 8, 8, device=device) if kind == "cnn" else torch.randn(N, 64, device=device)
    y = torch.randint(0, 10, (N,), device=device)
    return model, opt, x, y


def step_for(model, opt, x, y):
    return training_step(model, opt, nn.functional.cross_entropy, lambda m: (x[:m].clone(), y[:m]))


def brute_force(step, sizes, device="cpu"):
    return {m: step_peak(lambda: step(m), device=device, baseline=step.baseline_bytes).peak_bytes for m in sizes}


class Counting:
    def __init__(self, step):
        self.step, self.calls = step, 0
        self.device, self.baseline_bytes = step.device, step.baseline_bytes

    def __call__(self, m):
        self.calls += 1
        self.step(m)


def snapshot(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            copy.deepcopy(opt.state_dict()), torch.get_rng_state())


def assert_same(a, b):
    assert a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert [g is None for g in a[1]] == [g is None for g in b[1]]
    assert all(torch.equal(g, h) for g, h in zip(a[1], b[1]) if g is not None)
    assert a[2]["param_groups"] == b[2]["param_groups"] and a[2]["state"].keys() == b[2]["state"].keys()
    for i, state in a[2]["state"].items():
        assert state.keys() == b[2]["state"][i].keys()
        assert all(torch.equal(v, b[2]["state"][i][k]) for k, v in state.items())
    assert torch.equal(a[3], b[3])


@pytest.fixture(scope="module")
def measured():
    """Peaks of every size 2..N (BatchNorm needs 2 samples), the answer key for the limits below."""
    model, opt, x, y = make()
    return brute_force(step_for(model, opt, x, y), range(2, N + 1))


def test_peaks_grow_with_the_micro_batch(measured):
    sizes = sorted(measured)
    assert all(measured[a] <= measured[b] for a, b in zip(sizes, sizes[1:]))
    assert measured[N] > 2 * measured[2]


@pytest.mark.parametrize("answer", [3, 17, 40, 61, 90])
def test_probe_lands_on_the_brute_force_answer(measured, answer):
    limit = (measured[answer] + measured[answer + 1]) // 2 if answer < N else measured[N]
    truth = max(m for m, peak in measured.items() if peak <= limit)
    model, opt, x, y = make()
    before = snapshot(model, opt)
    result = probe_micro_batch(step_for(model, opt, x, y), limit=limit, upper=N, lower=2)
    print(f"answer {truth}: probed {result.size} in {result.seconds * 1000:.1f} ms, tried {result.tried}")
    assert 0.9 * truth <= result.size <= truth and result.size >= truth - 0.02 * truth
    assert result.size == truth or truth >= 100  # below 100 a 2% gap is less than two samples: exact
    assert result.peak_bytes == measured[result.size] <= limit and result.limit == limit
    assert not result.cached and not result.truncated
    assert len({m for m, _ in result.tried}) == len(result.tried) <= 12
    assert_same(before, snapshot(model, opt))  # Adam had no state: it has none again


def test_probe_returns_upper_when_everything_fits(measured):
    model, opt, x, y = make()
    result = probe_micro_batch(step_for(model, opt, x, y), limit="1GiB", upper=50, lower=2)
    assert result.size == 50 and [m for m, _ in result.tried] == [2, 4, 8, 16, 32, 50]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_probe_restores_existing_gradients_and_optimizer_state(optimizer):
    model, opt, x, y = make(optimizer)
    nn.functional.cross_entropy(model(x[:8]), y[:8]).backward()
    opt.step()  # momentum buffers (Adam: moments and step counts) exist, and gradients stay behind
    assert opt.state
    before = snapshot(model, opt)
    step = step_for(model, opt, x, y)
    result = probe_micro_batch(step, limit=static_bytes(model, opt) + 400_000, upper=N, lower=2)
    assert 2 <= result.size < N
    assert_same(before, snapshot(model, opt))
    nn.functional.cross_entropy(model(x[:8]), y[:8]).backward()
    opt.step()  # training goes on: the step's snapshot is stale now
    with pytest.raises(RuntimeError, match="changed since training_step"):
        step(4)


def test_a_wrapped_optimizer_takes_one_inner_step_and_keeps_its_count(fresh_init):
    model, opt, x, y = make()
    wrapped = fresh_init.Optimizer(opt, steps=2)
    step = training_step(model, wrapped, nn.functional.cross_entropy, lambda m: (x[:m], y[:m]))
    peak = step_peak(lambda: step(8), baseline=step.baseline_bytes).peak_bytes
    assert peak > step.baseline_bytes + 2 * static_bytes(model)  # Adam's moments were created: a real step
    assert wrapped.real_steps == 0 and not wrapped.stepped and not opt.state


def test_probe_error_when_the_smallest_size_does_not_fit():
    model, opt, x, y = make()
    step = step_for(model, opt, x, y)
    limit = step.baseline_bytes + 1000
    with pytest.raises(ProbeError) as info:
        probe_micro_batch(step, limit=limit, upper=N, lower=2)
    message = str(info.value)
    assert f"micro-batch 2 does not fit in the memory limit of {format_bytes(limit)} ({limit} bytes)" in message
    assert "passed it and was stopped" in message and "Raise the limit" in message
    assert f"the model and optimizer alone hold {format_bytes(step.baseline_bytes)}" in message
    assert isinstance(info.value, ValueError)


def test_running_out_of_memory_does_not_fit_and_is_undone():
    model, opt, x, y = make()

    def loss_fn(out, target):
        if len(target) > 37:
            torch.empty(2**60, dtype=torch.uint8)  # more than any machine: the allocator refuses
        return nn.functional.cross_entropy(out, target)

    before = snapshot(model, opt)
    result = probe_micro_batch(training_step(model, opt, loss_fn, lambda m: (x[:m], y[:m])), limit="1GiB",
                               upper=N, lower=2)
    assert result.size == 37 and (38, None) in result.tried and (64, None) in result.tried
    assert_same(before, snapshot(model, opt))  # the failed steps' forward (BatchNorm statistics) undone too


def test_another_error_is_raised_and_still_undone():
    model, opt, x, y = make()

    def loss_fn(out, target):
        raise ValueError("labels do not match")

    before = snapshot(model, opt)
    with pytest.raises(ValueError, match="labels do not match"):
        probe_micro_batch(training_step(model, opt, loss_fn, lambda m: (x[:m], y[:m])), limit="1GiB", upper=N)
    assert_same(before, snapshot(model, opt))


def test_time_budget_truncates_to_the_best_size_so_far(monkeypatch):
    model, opt, x, y = make()
    counting = Counting(step_for(model, opt, x, y))
    result = probe_micro_batch(counting, limit="1GiB", upper=N, lower=2, time_budget=0)
    assert result.truncated and result.size == 2 and counting.calls == 1

    # The probe's clock advances 0.05 s per step and nothing else: a loaded machine cannot move the cut.
    clock = [0.0]
    monkeypatch.setattr(probe_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    def slow(m):
        clock[0] += 0.05
        counting(m)

    slow.device, slow.baseline_bytes = counting.device, counting.baseline_bytes
    result = probe_micro_batch(slow, limit="1GiB", upper=N, lower=2, time_budget=0.12)
    assert result.truncated and [m for m, _ in result.tried] == [2, 4, 8] and result.size == 8  # 8 ended at 0.15 s


def test_cache_is_read_without_running_the_step(tmp_path, measured):
    cache = tmp_path / "probe.json"
    cache.write_text(json.dumps({"other": {"size": 7, "limit": 1}}))
    model, opt, x, y = make()
    counting = Counting(step_for(model, opt, x, y))
    key = probe_key(model, x, "cpu")
    limit = (measured[30] + measured[31]) // 2
    first = probe_micro_batch(counting, limit=limit, upper=N, lower=2, cache=cache, key=key)
    assert not first.cached and first.size == 30 and counting.calls > 0
    stored = json.loads(cache.read_text())
    assert stored["other"] == {"size": 7, "limit": 1} and stored[key]["size"] == 30
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]

    calls = counting.calls
    second = probe_micro_batch(counting, limit=limit, upper=N, lower=2, cache=str(cache), key=key)
    assert second.cached and second.size == 30 and second.peak_bytes == first.peak_bytes and counting.calls == calls
    # Another limit, or an upper bound that capped the cached size: probed again.
    assert not probe_micro_batch(counting, limit=measured[40], upper=N, lower=2, cache=cache, key=key).cached
    assert not probe_micro_batch(counting, limit=limit, upper=20, lower=2, cache=cache, key=key).cached
    assert not probe_micro_batch(counting, limit=limit, upper=N, lower=2, cache=cache, key=key).cached
    with pytest.raises(ValueError, match="cache needs a key"):
        probe_micro_batch(counting, limit=limit, upper=N, cache=cache)


def test_an_unreadable_cache_is_probed_again_and_rewritten(tmp_path, caplog):
    cache = tmp_path / "probe.json"
    cache.write_text("{not json")
    model, opt, x, y = make()
    result = probe_micro_batch(step_for(model, opt, x, y), limit="1GiB", upper=8, lower=2, cache=cache, key="k")
    assert not result.cached and json.loads(cache.read_text())["k"]["size"] == 8
    assert "unreadable" in caplog.text


def test_probe_arguments_are_checked():
    step = step_for(*make())
    for kwargs, says in [({"limit": "lots", "upper": 4}, "limit='lots' is not a memory size"),
                         ({"limit": None, "upper": 4}, "limit must be given"),
                         ({"limit": 10**9, "upper": 0}, "upper must be a positive integer"),
                         ({"limit": 10**9, "upper": 4, "lower": 8}, r"upper \(4\) is below lower \(8\)")]:
        with pytest.raises(ValueError, match=says):
            probe_micro_batch(step, **kwargs)


KEY_SCRIPT = """
import torch
from torch import nn
from flextrain.elastic.probe import probe_key
torch.manual_seed({seed})
model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
print(probe_key(model, torch.randn({batch}, 4), "cpu"))
"""


def test_probe_key_is_stable_across_processes_and_sees_what_matters():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    keys = [subprocess.run([sys.executable, "-c", KEY_SCRIPT.format(seed=seed, batch=batch)], env=env, check=True,
                           capture_output=True, text=True).stdout.strip() for seed, batch in ((0, 5), (1, 9))]
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    here = probe_key(model, torch.randn(2, 4), "cpu")
    assert keys == [here, here] and here.startswith("Sequential/cpu/")  # weights and batch size do not matter
    assert probe_key(model, torch.randn(2, 5), "cpu") != here  # the per-sample shape does
    assert probe_key(model, torch.randn(2, 4).double(), "cpu") != here
    assert probe_key(model, {"x": torch.randn(2, 4)}, "cpu") != here
    assert probe_key(model, torch.randn(2, 4), "cuda:0").startswith("Sequential/cuda/")
    model[0].requires_grad_(False)
    assert probe_key(model, torch.randn(2, 4), "cpu") != here  # frozen layers hold no gradients


@pytest.mark.cuda
def test_probe_on_cuda_lands_within_ten_percent():
    model, opt, x, y = make(device="cuda", kind="mlp")
    step = step_for(model, opt, x, y)
    sizes = range(2, N + 1)
    measured = brute_force(step, sizes, device="cuda")
    answer = 60
    limit = (measured[answer] + measured[answer + 1]) // 2
    truth = max(m for m, peak in measured.items() if peak <= limit)
    before, rng = snapshot(model, opt), torch.cuda.get_rng_state()
    result = probe_micro_batch(step, limit=limit, upper=N, lower=2)  # the step's device: CUDA
    print(f"cuda answer {truth}: probed {result.size} in {result.seconds * 1000:.1f} ms, tried {result.tried}")
    assert 0.9 * truth <= result.size <= truth and measured[result.size] <= limit
    assert_same(before, snapshot(model, opt))
    assert torch.equal(rng, torch.cuda.get_rng_state())


@pytest.mark.cuda
def test_probe_on_cuda_survives_out_of_memory():
    free, _ = torch.cuda.mem_get_info()
    model = nn.Linear(1024, 1024).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def batch_of(m):  # 4 KiB a sample: the device runs out long before upper
        return torch.randn(m, 1024, device="cuda"), torch.randn(m, 1024, device="cuda")

    step = training_step(model, opt, nn.functional.mse_loss, batch_of)
    upper = 4 * free // 4096
    result = probe_micro_batch(step, limit=10 * free, upper=upper, time_budget=60)
    assert any(peak is None for _, peak in result.tried)  # out of memory at least once, caught
    assert 0 < result.size < upper
    step(result.size)  # and the device is usable afterwards
