"""A job's training strategy in the worker (flextrain/worker/accelerating.py): applied so that the backend's own
micro-batch calls go through it, with the gradient buffers in the parameters' dtypes, checkpoints in the plain
model's keys (a compiled model's too) and loadable by a plain model, evaluation under the strategy's casts;
methods that cannot apply to the module are named; the search leaves the model as it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ft_helpers import DIGITS_MODEL
from flextrain.accelerate import Strategy
from flextrain.accelerate.jobs import check_setting, describe, job_candidate
from flextrain.elastic.statecodec import decode, encode
from flextrain.job import JobSpec
from flextrain.worker.accelerating import AccelerateSettingError, apply_for_job, check_framework, search_strategy
from flextrain.worker.contract import Framework
from flextrain.worker.module import load_model_def
from flextrain.worker.pytorch import TorchBackend, TorchPredictor


@pytest.fixture(scope="module")
def digits():
    return load_model_def(DIGITS_MODEL)


def accelerated(digits, text: str, seed: int = 0):
    torch.manual_seed(seed)
    acc = apply_for_job(check_setting(text), digits.build_model(), digits, source="test")
    optimizer = digits.build_optimizer(acc.core, None)
    return acc, TorchBackend(model_def=digits, model=acc.core, optimizer=optimizer, extra=4, compute=acc)


def batch(n: int = 16):
    g = torch.Generator().manual_seed(1)
    return torch.rand(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def one_step(backend: TorchBackend) -> float:
    x, y = batch()
    backend.zero()
    loss = backend.accumulate(x, y, slice(0, 10), scale=10 / 16) * 10
    loss += backend.accumulate(x, y, slice(10, 16), scale=6 / 16) * 6
    backend.gathered()  # as before an all-reduce
    backend.apply()
    return loss / 16


def test_amp_bf16_runs_the_backends_micro_batches_under_autocast(digits):
    acc, backend = accelerated(digits, "amp_native:bf16")
    x, _ = batch()
    assert acc.forward(x).dtype == torch.bfloat16 and acc.evaluate(x).dtype == torch.bfloat16
    assert [b.dtype for b in backend.buffers] == [torch.float32]  # the weights and gradients stay fp32
    before = acc.core.net[0].weight.detach().clone()
    one_step(backend)
    assert not torch.equal(before, acc.core.net[0].weight)


def test_half_reduces_bf16_gradients_and_its_checkpoint_loads_into_a_plain_model(digits):
    acc, backend = accelerated(digits, "half:bf16")
    assert [b.dtype for b in backend.buffers] == [torch.bfloat16]  # one buffer, the control slots at its end
    one_step(backend)
    tree = decode(encode(backend.state()))
    assert tree["model"]["net.0.weight"].dtype == torch.bfloat16
    plain = digits.build_model()
    plain.load_state_dict(tree["model"])  # evaluate/predict jobs run a plain model from a checkpoint
    assert torch.equal(plain.net[0].weight, acc.core.net[0].weight.float())


def test_a_compiled_model_checkpoints_in_the_plain_models_keys(digits):
    acc, backend = accelerated(digits, "compile:eager,checkpoint:Linear")
    assert type(acc.core).__name__ == "Model"  # the core: never the OptimizedModule
    one_step(backend)
    state = backend.state()
    assert list(state["model"]) == list(digits.build_model().state_dict())
    # A newcomer (or a resume) loads rank 0's state into its own compiled model: same weights after.
    other, other_backend = accelerated(digits, "compile:eager,checkpoint:Linear", seed=5)
    other_backend.load_state(decode(encode(state)))
    assert torch.equal(other.core.net[2].weight, acc.core.net[2].weight)
    x, _ = batch()
    assert torch.allclose(other.forward(x), acc.forward(x))


def test_the_same_steps_with_and_without_a_strategy_that_computes_the_same(digits):
    """checkpoint recomputes the forward: the same gradients, so the same weights after a step."""
    plain_acc, plain = accelerated(digits, "parallel_mode")  # a no-op in a job
    ckpt_acc, ckpt = accelerated(digits, "checkpoint:Linear")
    assert one_step(plain) == pytest.approx(one_step(ckpt))
    for a, b in zip(plain_acc.core.parameters(), ckpt_acc.core.parameters()):
        assert torch.allclose(a, b)


def test_the_evaluation_runs_under_the_strategy(digits, digits_data):
    """The predictor casts the features to half's bf16 weights (a plain call would fail on fp32 input)."""
    from flextrain.data import read_records
    from flextrain.worker.contract import FeedMetadata, Mode

    acc, _ = accelerated(digits, "half:bf16")
    records = read_records(sorted((digits_data / "validation").glob("*.rio"))[0])[:10]
    predictor = TorchPredictor(digits, acc.core, acc.evaluate)
    out = list(predictor.batches(records, mode=Mode.EVALUATION, metadata=FeedMetadata("v", 0, 10, 0), batch_size=4))
    assert [p.shape[0] for p, _ in out] == [4, 4, 2] and {p.dtype for p, _ in out} == {torch.bfloat16}
    with pytest.raises(RuntimeError):
        acc.core(batch()[0])  # what evaluation would do without the strategy's casts


def test_a_method_that_cannot_apply_to_the_module_is_named(digits):
    with pytest.raises(AccelerateSettingError) as info:
        apply_for_job(check_setting("channels_last"), digits.build_model(), digits)
    assert "--accelerate asks for 'channels_last', which cannot apply to the model of" in str(info.value)
    assert "no 2-D convolution" in str(info.value) and "skip_unavailable" not in str(info.value)


def test_keras_modules_are_refused_naming_the_module():
    spec = JobSpec.of(name="j", model_def="m.py:M", job_dir="/j", training_data="d", accelerate="amp_native:bf16")
    keras = SimpleNamespace(framework=Framework.TENSORFLOW, path="/zoo/digits_keras.py")
    with pytest.raises(AccelerateSettingError, match="/zoo/digits_keras.py is a tensorflow module"):
        check_framework(spec, keras)


def test_the_search_leaves_the_model_alone_and_chooses_what_a_job_applies(digits, digits_data, tmp_path,
                                                                           monkeypatch):
    import flextrain.worker.accelerating as accelerating

    # Lean: no torch.compile (inductor's C++ build) in this run of the search.
    monkeypatch.setattr(accelerating, "SEARCH_EXCLUDED", (*accelerating.SEARCH_EXCLUDED, "native_dynamo"))
    spec = JobSpec.of(name="j", model_def=DIGITS_MODEL, job_dir=str(tmp_path), training_data=str(digits_data / "train"),
                      global_batch_size=32, accelerate="auto")
    torch.manual_seed(0)
    model = digits.build_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    chosen, summary = search_strategy(spec, digits, model, time_limit=10.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(chosen, Strategy) and job_candidate(chosen)
    assert summary["microBatch"] == 32 and summary["plainSamplesPerSecond"] > 0
    names = [row["strategy"] for row in summary["candidates"]]
    assert names[0] == "no methods" and "amp_native:bf16" in names and "half:bf16" in names, names
    assert not any(n.startswith(("zero", "fsdp", "amp_native:fp16", "compile")) for n in names), names
    assert summary["chosen"] == describe(chosen)
