"""InfinityBatch: a batch of 2048 in micro-batches gives the update of one full-batch step (MLP, CNN,
with and without BatchNorm), the custom loop of infinitybatch's README works as written and bounds
memory for real, eval, callbacks, the event monitor, history and bad settings."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

from flextrain.elastic.ib_events import Callback, LoopWarning
from flextrain.elastic.infinity import GhostBatchWarning, InfinityBatch
from flextrain.elastic.microbatch import BatchError

B, M = 2048, 256
TOL = {"rtol": 1e-4, "atol": 1e-6}  # float32: the micro-batches sum in another order than one batch


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))


def cnn(batch_norm: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    norm = [torch.nn.BatchNorm2d(8)] if batch_norm else []
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), *norm, torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))


def data(model_kind: str, n: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 12, generator=g) if model_kind == "mlp" else torch.randn(n, 1, 8, 8, generator=g)
    return x, torch.randint(0, 5, (n,), generator=g)


def loader(x, y, batch=B):
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)]


def full_batch_step(model, x, y, lr=0.1):
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    opt.step()
    return ref


def ghost_batch_step(model, x, y, micro, lr=0.1):
    """What micro-batching means with BatchNorm: each micro-batch normalised on its own."""
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    for start in range(0, len(x), micro):
        xs, ys = x[start:start + micro], y[start:start + micro]
        (torch.nn.functional.cross_entropy(ref(xs), ys) * len(xs) / len(x)).backward()
    opt.step()
    return ref


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, t), (_, u) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(t, u, **TOL, msg=name)


def make_ib(model, x, y, **kw) -> InfinityBatch:
    ib = InfinityBatch(**kw)
    ib.model = model
    ib.criterion = torch.nn.CrossEntropyLoss()
    ib.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ib.dataloader = loader(x, y)
    return ib


def custom_loop(ib: InfinityBatch) -> None:
    """infinitybatch README's custom use case, one epoch, as written."""
    for inputs, targets in ib.dataloader:
        outputs = ib.batch_()
        loss = ib.criterion(outputs, targets)
        loss.backward()
        ib.step()
        ib.zero_grad()


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("loop", ["manager", "custom"])
def test_micro_batches_give_the_full_batch_update(kind, loop):
    x, y = data(kind)
    model = mlp() if kind == "mlp" else cnn()
    expected = full_batch_step(model, x, y)
    ib = make_ib(model, x, y, max_micro_batch=M)
    ib(1) if loop == "manager" else custom_loop(ib)
    assert ib.micro_batch_size == M and ib.steps_done == 1
    assert_same_state(ib.model, expected)


@pytest.mark.parametrize("mechanism", ["accumulate", "recompute"])
def test_batch_norm_micro_batches_are_ghost_batches_with_one_warning(mechanism):
    x, y = data("cnn")
    model = cnn(batch_norm=True)
    expected = ghost_batch_step(model, x, y, M)  # parameters and running statistics alike
    ib = make_ib(model, x, y, max_micro_batch=M, mechanism=mechanism)
    with pytest.warns(GhostBatchWarning, match=r"batch-statistics layers \(1\).*micro-batches of 256.*ghost batch"):
        ib(1) if mechanism == "accumulate" else custom_loop(ib)
    assert_same_state(ib.model, expected)
    assert int(ib.model[1].num_batches_tracked) == B // M  # one running-statistics update per micro-batch


@pytest.mark.parametrize("loop", ["manager", "custom"])
def test_offload_keeps_the_whole_batch_statistics(loop):
    x, y = data("cnn")
    model = cnn(batch_norm=True)
    expected = full_batch_step(model, x, y)
    ib = make_ib(model, x, y, max_micro_batch=M, mechanism="offload")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GhostBatchWarning)  # offload: no ghost batches, no warning
        ib(1) if loop == "manager" else custom_loop(ib)
    assert_same_state(ib.model, expected)


def test_recomputation_replays_dropout_masks():
    """The recomputed forward draws the same dropout masks as the first (the RNG state is kept):
    the custom loop's update equals accumulating the same micro-batches in the same order."""
    def dropout_mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                   torch.nn.Linear(32, 5))
    x, y = data("mlp")
    accumulated, recomputed = make_ib(dropout_mlp(), x, y, max_micro_batch=M), make_ib(dropout_mlp(), x, y,
                                                                                        max_micro_batch=M)
    torch.manual_seed(7)
    accumulated(1)
    torch.manual_seed(7)
    custom_loop(recomputed)
    assert_same_state(accumulated.model, recomputed.model)


def test_eval_matches_a_plain_no_grad_loop():
    x, y = data("mlp", 1000)
    model = mlp()
    ib = make_ib(model, x, y, max_micro_batch=96)
    got = ib.eval(loader(x, y, 300), metrics={"loss": torch.nn.CrossEntropyLoss(), "accuracy": "accuracy"})
    with torch.no_grad():
        out = model(x)
    assert got["samples"] == 1000
    assert got["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(out, y)), rel=1e-5)
    assert got["accuracy"] == pytest.approx(float((out.argmax(1) == y).float().mean()), abs=1e-9)
    assert model.training  # restored


def test_callbacks_fire_in_order_and_history_is_saved(tmp_path):
    calls = []

    class Recorder(Callback):
        def on_epoch_start(self, ib, epoch): calls.append(("epoch_start", epoch))
        def on_batch_start(self, ib, batch): calls.append(("batch_start", batch))
        def on_step(self, ib, step): calls.append(("step", step))
        def on_batch_end(self, ib, batch, stats): calls.append(("batch_end", batch, stats["samples"]))
        def on_epoch_end(self, ib, epoch, stats): calls.append(("epoch_end", epoch, stats["samples"]))

    x, y = data("mlp", 1000)
    ib = make_ib(mlp(), x, y, max_micro_batch=200, callbacks=[Recorder()])
    ib.dataloader = loader(x, y, 500)
    history = ib(2)
    assert calls[:6] == [("epoch_start", 0), ("batch_start", 0), ("step", 1), ("batch_end", 0, 500),
                         ("batch_start", 1), ("step", 2)]
    assert calls[6:8] == [("batch_end", 1, 500), ("epoch_end", 0, 1000)] and calls[-1] == ("epoch_end", 1, 1000)
    assert [h["epoch"] for h in history] == [0, 1] and all(h["steps"] == 2 and h["samples"] == 1000 for h in history)
    assert history[1]["loss"] < history[0]["loss"] and history[0]["micro_batch_size"] == 200
    rows = json.loads(ib.history.save(tmp_path / "h.json").read_text())
    assert rows[0]["samples"] == 1000
    csv_lines = ib.history.save(tmp_path / "h.csv").read_text().splitlines()
    assert csv_lines[0].startswith("epoch,loss,samples") and len(csv_lines) == 3
    with pytest.raises(ValueError, match=r"h\.txt: the name must end in \.csv or \.json"):
        ib.history.save(tmp_path / "h.txt")
    assert len(ib.inputs) <= 8 and len(ib.losses) <= 8  # bounded, unlike the reference's


def test_the_event_monitor_names_a_forgotten_step_and_zero_grad():
    x, y = data("mlp", 600)
    ib = make_ib(mlp(), x, y, max_micro_batch=100)
    ib.dataloader = loader(x, y, 200)
    batches = iter(ib.dataloader)
    _, targets = next(batches)
    ib.criterion(ib.batch_(), targets).backward()
    _, targets = next(batches)
    with pytest.warns(LoopWarning, match=r"without ib\.step\(\) after the previous batch's backward"):
        ib.criterion(ib.batch_(), targets).backward()
    ib.step()
    _, targets = next(batches)
    with pytest.warns(LoopWarning, match=r"ib\.step\(\) without ib\.zero_grad\(\)"):
        ib.batch_()


def test_the_readme_spelling_and_reference_calls():
    x, y = data("mlp", 512)
    ib = InfinityBatch(max_micro_batch=128, verbose=True)
    ib.model = mlp()
    ib.criterion = torch.nn.CrossEntropyLoss()
    ib.optimier = torch.optim.SGD(ib.model.parameters(), lr=0.1)  # the README's spelling
    assert ib.optimizer is ib.optimier and ib.verbose_mode
    ib.dataloader = loader(x, y, 512)
    for _inputs, _targets in ib.dataloader:
        ib.batch_()
        ib.loss()
        ib.backward()
        ib.step()
        ib.zero_grad()
    assert ib.steps_done == 1 and len(ib.outputs) == 1 and not ib.outputs[0].requires_grad


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"memory_limit"):
        InfinityBatch(memory_limit=-5)
    with pytest.raises(ValueError, match=r'max_micro_batch must be a positive integer, "auto" or None, got 0'):
        InfinityBatch(max_micro_batch=0)
    with pytest.raises(ValueError, match=r"mechanism must be one of"):
        InfinityBatch(mechanism="magic")
    ib = make_ib(mlp(), *data("mlp", 64), max_micro_batch=16)
    ib.dataloader = [(["a", "b"], torch.zeros(2, dtype=torch.long))]
    with pytest.raises(BatchError, match=r"the inputs of batch 0 is a str: expected a tensor"):
        ib(1)
    ib.dataloader = [torch.zeros(4, 12)]
    with pytest.raises(BatchError, match=r"the dataloader yielded a Tensor as batch 0: expected \(inputs, targets\)"):
        ib.epoch()
    with pytest.raises(RuntimeError, match=r"needs ib\.criterion set first"):
        InfinityBatch(model=mlp(), optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1), dataloader=[]).epoch()
    with pytest.raises(RuntimeError, match=r"ib\.batch_\(\) without inputs needs a batch"):
        InfinityBatch(model=mlp()).batch_()


def fitting_limit(model, x, y, size):
    """The measured peak of a training step of ``size`` samples: the limit under which ``size`` just fits."""
    from flextrain.elastic.memory import step_peak
    from flextrain.elastic.probe import training_step

    probe_model = copy.deepcopy(model)
    step = training_step(probe_model, torch.optim.SGD(probe_model.parameters(), lr=0.1, momentum=0.9),
                         torch.nn.CrossEntropyLoss(), lambda m: (x[:m], y[:m]))
    return step_peak(lambda: step(size), baseline=step.baseline_bytes).peak_bytes, step


@pytest.mark.parametrize("loop", ["manager", "custom"])
def test_a_memory_limit_bounds_the_step_for_real_and_keeps_the_full_batch_update(loop):
    """Logical batch 2048, a limit under which 256 samples just fit: the probe picks a size within 10%
    below 256, the update is the full batch's, and the measured peak of the whole step (custom loop:
    batch_, the script's loss and backward, step) stays within the limit, where a plain step of the
    batch needs several times it."""
    from flextrain.elastic.memory import static_bytes, step_peak

    x, y = data("cnn")
    model = cnn()
    limit, step = fitting_limit(model, x, y, M)
    whole = step_peak(lambda: step(B), baseline=step.baseline_bytes).peak_bytes
    assert whole > 3 * limit
    expected = full_batch_step(model, x, y)
    ib = make_ib(model, x, y, memory_limit=limit)
    ib(1) if loop == "manager" else custom_loop(ib)  # the first batch probes (its snapshot is extra)
    # batch_() leaves room for the batch's outputs (4 x 2048 x 5 floats): a smaller size in the custom loop
    low = 0.9 * M if loop == "manager" else 0.6 * M
    assert low <= ib.micro_batch_size <= M and ib.probe is not None and not ib.probe.cached, ib.micro_batch_size
    assert_same_state(ib.model, expected)
    peak = step_peak(lambda: ib(1) if loop == "manager" else custom_loop(ib),
                     baseline=static_bytes(ib.model, ib.optimizer)).peak_bytes
    assert peak <= limit * 1.01, (peak, limit)  # + a few kB: loss scalars, the weighted loss


@pytest.mark.parametrize("env", [{"FLEXTRAIN_MAX_MICRO_BATCH": "64"}, {"FLEXTRAIN_MAX_MICRO_BATCH": "auto",
                                                                       "FLEXTRAIN_MEMORY_LIMIT": "100kB"}])
def test_the_environment_tells_a_script_kept_as_written(monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    x, y = data("mlp", 512)
    ib = make_ib(mlp(), x, y)
    ib(1)
    assert ib.max_micro_batch == ("auto" if env["FLEXTRAIN_MAX_MICRO_BATCH"] == "auto" else 64)
    assert ib.micro_batch_size < 512 and (ib.probe is None) == (env["FLEXTRAIN_MAX_MICRO_BATCH"] == "64")


@pytest.mark.cuda
@pytest.mark.parametrize("mechanism", ["accumulate", "recompute", "offload"])
def test_on_cuda_the_update_is_the_full_batch_and_the_allocator_peak_is_bounded(mechanism):
    """The batch stays in host memory; micro-batches (or offloaded activations) bound the CUDA
    allocator's peak well below a whole-batch step's, with the same update."""
    x, y = data("cnn")
    model = cnn().cuda()
    expected = full_batch_step(model, x.cuda(), y.cuda())
    whole = copy.deepcopy(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.nn.functional.cross_entropy(whole(x.cuda()), y.cuda()).backward()
    whole_peak = torch.cuda.max_memory_allocated() - base
    del whole
    ib = make_ib(model, x, y, max_micro_batch=M, mechanism=mechanism)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ib(1) if mechanism == "accumulate" else custom_loop(ib)
    peak = torch.cuda.max_memory_allocated() - base
    assert_same_state(ib.model, expected)
    # offload still holds one layer's input and output for the whole batch: less than all of them
    assert peak < (whole_peak if mechanism == "offload" else whole_peak / 2), (peak, whole_peak)
    assert "allocated" in ib.memory.last


def test_a_bigger_batch_than_the_probed_one_is_probed_again_when_the_first_fitted_whole():
    x, y = data("mlp", 2048 + 64)
    limit, _ = fitting_limit(mlp(), x, y, 512)
    ib = make_ib(mlp(), x, y, memory_limit=limit)
    ib.dataloader = [(x[:64], y[:64]), (x[64:], y[64:])]  # a small batch first
    ib(1)
    assert ib.probe.size < 2048 and ib.micro_batch_size == ib.probe.size > 64, ib.probe  # probed on 2048 too


def test_launched_as_several_processes_without_a_process_group_it_says_each_trains_alone(monkeypatch):
    """`flextrain run --workers 2` of an InfinityBatch script with no process group trained the whole data
    twice, silently."""
    x, y = data("mlp")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.warns(UserWarning, match="WORLD_SIZE=2 but torch.distributed has no process group: each of the 2"):
        make_ib(mlp(), x, y, max_micro_batch=B).train(2)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_ib(mlp(), x, y, max_micro_batch=B).train(1)
