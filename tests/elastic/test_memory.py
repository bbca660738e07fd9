"""Memory accounting: sizes, the container's limit, a step's peak (checked against hand counts), the
model summary and the monitor. Real torch throughout; the CUDA variants skip without a device."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from flextrain.elastic.memory import (MemoryMonitor, default_memory_limit, format_bytes, parse_memory, static_bytes,
                                      step_peak)
from flextrain.elastic.model_summary import summary

GiB, MiB = 2**30, 2**20


# ---- parse_memory --------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (None, None), (1024, 1024), ("1024", 1024), ("512MB", 512 * 10**6), ("512mb", 512 * 10**6),
    ("1.5GiB", 3 * GiB // 2), ("1.5gib", 3 * GiB // 2), ("2G", 2 * GiB), ("2g", 2 * GiB), ("300 MiB", 300 * MiB),
    ("4Gi", 4 * GiB), ("1kB", 1000), ("1K", 1024), (" 2 TB ", 2 * 10**12), ("0.5KiB", 512), (".5k", 512),
    ("1.0001KiB", 1024), ("10b", 10), (1500.0, 1500), (2.7, 2), ("1T", 2**40),
])
def test_parse_memory_accepts(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value, says", [
    (0, "more than zero bytes"), (-1, "more than zero bytes"), ("0", "more than zero bytes"),
    (-0.5, "more than zero bytes"), ("-5MB", "is not a memory size"), (float("nan"), "is not a memory size"),
    (float("inf"), "is not a memory size"), ("12 parsecs", "is not a memory size"), ("MB", "is not a memory size"),
    ("", "is not a memory size"), ("1.2.3GB", "is not a memory size"), (True, "is not a memory size"),
    ([1], "is not a memory size"), (0.5, "less than one byte"), ("0.1", "less than one byte"),
])
def test_parse_memory_refuses_naming_what_the_value_and_an_example(value, says):
    with pytest.raises(ValueError) as info:
        parse_memory(value, what="limit")
    message = str(info.value)
    assert message.startswith(f"limit={value!r} ") and says in message
    assert "'4GiB'" in message  # an accepted spelling to copy


# ---- default_memory_limit ------------------------------------------------------------------

def fake_root(tmp_path, *, v2=None, v1=None, total=16 * GiB, available=10 * GiB):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text(f"MemTotal:       {total // 1024} kB\nMemFree:  1 kB\n"
                                           f"MemAvailable:   {available // 1024} kB\n")
    if v2 is not None:
        (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/memory.max").write_text(f"{v2}\n")
    if v1 is not None:
        (tmp_path / "sys/fs/cgroup/memory").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text(f"{v1}\n")
    return tmp_path


def test_default_memory_limit_reads_cgroup_v2(tmp_path):
    assert default_memory_limit(root=fake_root(tmp_path, v2=4 * GiB)) == int(0.8 * 4 * GiB)
    assert default_memory_limit(fraction=0.5, root=tmp_path) == 2 * GiB


def test_default_memory_limit_v2_max_falls_back_to_meminfo(tmp_path):
    assert default_memory_limit(root=fake_root(tmp_path, v2="max")) == int(0.8 * 10 * GiB)


def test_default_memory_limit_reads_cgroup_v1(tmp_path):
    assert default_memory_limit(root=fake_root(tmp_path, v1=3 * GiB), fraction=1) == 3 * GiB


def test_default_memory_limit_v1_unlimited_falls_back_to_meminfo(tmp_path):
    root = fake_root(tmp_path, v1=9223372036854771712)  # what cgroup v1 reports for "no limit"
    assert default_memory_limit(root=root) == int(0.8 * 10 * GiB)


def test_a_cgroup_limit_above_the_machine_does_not_bind(tmp_path):
    assert default_memory_limit(root=fake_root(tmp_path, v2=64 * GiB)) == int(0.8 * 10 * GiB)


def test_default_memory_limit_without_anything_to_read(tmp_path):
    with pytest.raises(RuntimeError, match="memory_limit='8GiB'"):
        default_memory_limit(root=tmp_path)
    for bad in (0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match="fraction"):
            default_memory_limit(fraction=bad, root=tmp_path)


def test_default_memory_limit_here():
    assert default_memory_limit() > 0


# ---- step_peak -----------------------------------------------------------------------------

def test_step_peak_counts_allocations_once_and_frees():
    def fn():
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(2000)  # 8000: 12000 held
        v = a.view(10, 100)[2:]  # a view: no new storage
        del a, v
        c = torch.empty(500)  # a freed: 10000 held
        d = torch.tensor([1.0, 2.0])  # built outside the dispatcher, lifted: 8 bytes
        return b, c, d

    measured = step_peak(fn, baseline=100)
    assert measured.peak_bytes == 100 + 12000
    assert [t.numel() for t in measured.result] == [2000, 500, 2]
    with pytest.raises(ValueError, match="baseline"):
        step_peak(fn, baseline=-1)


D, H, C = 64, 256, 10


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, C))


def mlp_step(model, optimizer, batch):
    def step():
        x, y = torch.randn(batch, D), torch.randint(0, C, (batch,))
        nn.functional.cross_entropy(model(x), y).backward()
        if optimizer is not None:
            optimizer.step()
    return step


def test_step_peak_of_an_mlp_step_matches_a_hand_count():
    model = mlp()
    base = static_bytes(model)
    assert base == 4 * (D * H + H + H * C + C)
    B = 1024
    peak = step_peak(mlp_step(model, None, B), baseline=base).peak_bytes
    # The peak is at the ReLU's backward: held then are the input x (B*D floats) and targets y
    # (B int64), the ReLU's saved output, the gradient w.r.t. it and w.r.t. its input (3 x B*H
    # floats), and the last Linear's gradients (H*C + C floats); the parameters are the baseline.
    hand = base + B * (4 * D + 8 + 3 * 4 * H) + 4 * (H * C + C)
    assert abs(peak - hand) <= 0.02 * hand, (peak, hand)


def test_step_peak_counts_gradients_and_adam_state_created_inside():
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    base = static_bytes(model, opt)
    P = base  # parameters only: no gradients, no state yet
    peak = step_peak(mlp_step(model, opt, 1), baseline=base).peak_bytes
    # Adam's first step holds the gradients (P), both moments (2P) and 4 step counts, plus its
    # temporaries for one parameter at a time (at most two of the largest: 2 x D*H floats).
    assert base + 3 * P + 16 <= peak <= base + 3 * P + 16 + 2 * 4 * D * H + 4 * (D + 8), (peak, P)
    assert static_bytes(model, opt) == base + 3 * P + 16  # the step left gradients and state behind


def test_step_peak_agrees_with_torchs_mem_tracker():
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    model, B = mlp(), 512
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ours = step_peak(mlp_step(model, opt, B), baseline=static_bytes(model, opt)).peak_bytes
    model.zero_grad(set_to_none=True)
    opt.state.clear()
    tracker = mem_tracker.MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        mlp_step(model, opt, B)()
    theirs = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert abs(ours - theirs) <= 0.01 * theirs, (ours, theirs)


def test_step_peak_is_monotone_in_batch_size():
    model = mlp()
    base = static_bytes(model)
    peaks = []
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        model.zero_grad(set_to_none=True)
        peaks.append(step_peak(mlp_step(model, None, batch), baseline=base).peak_bytes)
    assert peaks == sorted(peaks) and peaks[-1] > peaks[-2] > peaks[-3], peaks


def test_static_bytes_counts_shared_storage_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: one storage
    assert static_bytes(model) == 160
    model(torch.tensor([1, 2])).sum().backward()
    assert static_bytes(model) == 320  # and its gradient


# ---- summary -------------------------------------------------------------------------------

class Mixed(nn.Module):
    """A frozen float32 layer, BatchNorm (buffers), a float64 head, a parameter on the model itself."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.frozen = nn.Linear(8, 16).requires_grad_(False)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(16, 4).double()

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.frozen(x) * self.scale))).double())


def test_summary_rows_counts_and_bytes():
    s = summary(Mixed())
    assert [(r.name, r.type, r.parameters, r.trainable, r.dtypes, r.bytes) for r in s.modules] == [
        ("", "Mixed", 1, 1, ("float32",), 4),
        ("frozen", "Linear", 144, 0, ("float32",), 576),
        ("bn", "BatchNorm1d", 32, 32, ("float32",), 128),
        ("head", "Linear", 68, 68, ("float64",), 544),
    ]
    assert (s.parameters, s.trainable) == (245, 101)
    assert (s.parameter_bytes, s.gradient_bytes, s.buffer_bytes) == (1252, 4 + 128 + 544, 64 + 64 + 8)
    assert s.optimizer_state_bytes is None and s.activation_peaks == () and s.notes == ()
    text = str(s)
    assert "parameters: 245 (101 trainable, 144 frozen)" in text
    assert "parameter bytes: 1.2 KiB; gradients: 676 B; buffers: 136 B" in text
    assert "(model)" in text and "float64" in text and "BatchNorm1d" in text
    assert json.loads(json.dumps(s.as_dict()))["modules"][3]["dtypes"] == ["float64"]


def test_summary_optimizer_state_estimated_then_measured():
    model = Mixed()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    before = summary(model, optimizer=opt)
    assert before.optimizer_state_bytes == 2 * (4 + 128 + 544) + 5 * 4  # 2 moments + 5 step counts
    assert "estimated" in before.notes[0] and "Adam" in before.notes[0]
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    after = summary(model, optimizer=opt)
    assert after.optimizer_state_bytes == before.optimizer_state_bytes and after.notes == ()
    assert "optimizer state: 1.3 KiB" in str(after)


@pytest.mark.parametrize("make, copies", [
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),
    (lambda p: torch.optim.AdamW(p, lr=0.1, amsgrad=True), 3),
    (lambda p: torch.optim.RMSprop(p, lr=0.1, centered=True), 2),
])
def test_summary_estimates_match_what_a_step_creates(make, copies):
    model = Mixed()
    opt = make(model.parameters())
    estimate = summary(model, optimizer=opt).optimizer_state_bytes
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    assert summary(model, optimizer=opt).optimizer_state_bytes == estimate
    assert estimate - copies * (4 + 128 + 544) in (0, 5 * 4)  # plus the step counts, where kept


def test_summary_estimates_each_parameter_group():
    model = Mixed()
    opt = torch.optim.SGD([{"params": [model.scale, *model.bn.parameters()], "momentum": 0.9},
                           {"params": model.head.parameters()}], lr=0.1)
    estimate = summary(model, optimizer=opt).optimizer_state_bytes
    assert estimate == 4 + 128  # momentum buffers for the first group only
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    assert summary(model, optimizer=opt).optimizer_state_bytes == estimate


def test_summary_without_an_estimate_says_so():
    model = Mixed()
    s = summary(model, optimizer=torch.optim.Adadelta(model.parameters()))
    assert s.optimizer_state_bytes is None and "Adadelta" in s.notes[0] and "take one step" in s.notes[0]


def test_summary_activation_peaks_grow_and_leave_the_model_as_it_was():
    model = Mixed()
    x = torch.randn(32, 8)
    model(x).sum().backward()  # gradients exist: the summary must keep them
    grads = [p.grad for p in model.parameters()]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grad_values = [None if g is None else g.clone() for g in grads]
    rng = torch.get_rng_state()
    s = summary(model, x, micro_batch_sizes=(2, 8, 32), loss_fn=lambda out: out.pow(2).mean())
    sizes, peaks = zip(*s.activation_peaks)
    assert sizes == (2, 8, 32) and peaks[0] < peaks[1] < peaks[2], peaks
    # At least what backward creates: the trainable parameters' gradients.
    assert peaks[0] >= s.gradient_bytes
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert all(torch.equal(g, v) for g, v in zip(grads, grad_values) if g is not None)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # BatchNorm statistics too
    assert torch.equal(rng, torch.get_rng_state())
    assert "forward+backward, micro-batch 32:" in str(s)
    assert summary(model, x).activation_peaks[0][0] == 32  # default: the input's batch
    with pytest.raises(ValueError, match=r"micro_batch_sizes must be integers in \[1, 32\]"):
        summary(model, x, micro_batch_sizes=(64,))


def test_summary_takes_a_dict_input():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 2), nn.Linear(5, 2)

        def forward(self, features):
            return {"out": self.a(features["x"]) + self.b(features["z"])}

    s = summary(Two(), {"x": torch.randn(6, 3), "z": torch.randn(6, 5)}, micro_batch_sizes=(1, 6))
    assert [size for size, _ in s.activation_peaks] == [1, 6] and s.activation_peaks[1][1] > 0


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1536, 3 * MiB // 2, GiB, 1023 * 1024 + 1000, -2048)] == [
        "0 B", "1023 B", "1.5 KiB", "1.5 MiB", "1.0 GiB", "1.0 MiB", "-2.0 KiB"]


# ---- MemoryMonitor -------------------------------------------------------------------------

def test_memory_monitor_on_the_cpu_keeps_a_bounded_history():
    monitor = MemoryMonitor(keep=3)
    assert monitor.last is None
    for step in range(5):
        entry = monitor.record(step)
    assert entry["step"] == 4 and entry["rss"] > 0 and entry["peak_rss"] >= entry["rss"]
    assert [e["step"] for e in monitor.history] == [2, 3, 4] and monitor.last is entry
    with pytest.raises(ValueError, match="keep"):
        MemoryMonitor(keep=0)


# ---- CUDA ----------------------------------------------------------------------------------

@pytest.mark.cuda
def test_step_peak_on_cuda_is_absolute_and_monotone():
    model = mlp().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sizes = (64, 2048, 4096, 8192)
    peaks = []
    for batch in sizes:
        def step():
            x, y = torch.randn(batch, D, device="cuda"), torch.randint(0, C, (batch,), device="cuda")
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        torch.cuda.empty_cache()  # no cached block of another size is reused (and counted whole)
        peaks.append(step_peak(step, device="cuda", baseline=10**12).peak_bytes)  # baseline: not added on CUDA
    assert peaks == sorted(peaks) and peaks[-1] > peaks[1]
    assert static_bytes(model, opt) <= peaks[0] < 10**12  # parameters, gradients and state are on the device
    # Between two activation-bound sizes the peak grows by the hand count's per-sample bytes
    # (test_step_peak_of_an_mlp_step_matches_a_hand_count); workspaces are the same in both.
    hand = (sizes[-1] - sizes[1]) * (4 * D + 8 + 3 * 4 * H)
    assert abs((peaks[-1] - peaks[1]) - hand) <= 0.05 * hand, (peaks, hand)


@pytest.mark.cuda
def test_memory_monitor_on_cuda():
    monitor = MemoryMonitor(device="cuda")
    keep = torch.empty(MiB, device="cuda")
    entry = monitor.record(1)
    assert entry["allocated"] >= keep.nbytes and entry["peak"] >= entry["allocated"]
    assert entry["reserved"] >= entry["allocated"]
    del keep
    assert monitor.record(2)["peak"] <= entry["allocated"]  # the peak was reset after the first sample
