"""auto_accelerate in semi-automatic mode: the reference's examples, the result's training loop, errors."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from accel_models import Block, BlockNet, DictData, DictModel, TupleModel, mse, regression, train
from flextrain.accelerate import AccelerateError, Report, Strategy, UnavailableMethodError, UnknownMethodError, \
    auto_accelerate
from flextrain.accelerate.errors import ConfigError


def common(**kw):
    kw.setdefault("optim_func", torch.optim.AdamW)
    kw.setdefault("dataset", regression())
    kw.setdefault("loss_func", mse)
    kw.setdefault("optim_args", {"lr": 0.01})
    kw.setdefault("dataloader_args", {"batch_size": 32, "shuffle": True})
    return kw


def test_the_reference_example_trains_with_the_ordinary_loop(tmp_path):
    torch.manual_seed(0)
    status, result, best = auto_accelerate(TupleModel(BlockNet()), **common(),
                                           load_strategy=["parallel_mode", ("amp_native", "bf16")],
                                           save_strategy_to_file=str(tmp_path / "s.json"))
    assert status is True
    assert result._fields == ("model", "optim", "dataloader", "loss_func", "prepare_input")
    model, optim, dataloader, loss_func, prepare_input = result  # the reference's five names (it had 7)
    assert (model, optim, dataloader) == (result.model, result.optim, result.dataloader)
    assert best == Strategy([("parallel_mode", ([("data", 1)], None)), ("amp_native", "bf16")])
    assert isinstance(result.args, Report) and result.args.dry_run is None  # ignore_dryrun defaults to True
    assert result.dataloader.batch_size == 32 and result.lr_scheduler is None
    losses = train(result, epochs=3)
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])
    assert Strategy.load(str(tmp_path / "s.json")) == best
    assert json.loads((tmp_path / "s.json").read_text())["methods"][1]["config"]["dtype"] == "bf16"


def test_atorch_examples_strategy_with_checkpoint_scheduler_and_param_groups():
    """ATorch's examples/auto_accelerate/train.py builds ["parallel_mode", ("amp_native", {...}),
    ("checkpoint", (Block,))] (+ "module_replace", fsdp on GPUs), grouped params and a scheduler."""
    def optim_param_func(model):
        return [{"params": [p for n, p in model.named_parameters() if "bias" not in n], "weight_decay": 0.01},
                {"params": [p for n, p in model.named_parameters() if "bias" in n], "weight_decay": 0.0}]

    strategy = ["parallel_mode", ("amp_native", {"dtype": torch.bfloat16}), ("checkpoint", (Block,))]
    status, result, best = auto_accelerate(
        TupleModel(BlockNet()), **common(), optim_param_func=optim_param_func, load_strategy=strategy,
        lr_scheduler_cls=torch.optim.lr_scheduler.StepLR, lr_scheduler_args={"step_size": 4, "gamma": 0.5},
        ignore_dryrun_on_load_strategy=False, verbose=True)
    assert status and best.names == ("parallel_mode", "amp_native", "checkpoint")
    assert [g["weight_decay"] for g in result.optim.param_groups] == [0.01, 0.0]
    dry = result.args.dry_run
    assert dry.ok and dry.samples_per_second > 0 and dry.peak_bytes > 0 and len(dry.losses) == 4
    losses = []
    for _ in range(2):
        losses += train(result, epochs=1)
        result.lr_scheduler.step()
    assert result.optim.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5 ** 0)  # 2 scheduler steps < step_size
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("fmt", ["unpack_dict", "unpack_sequence"])
def test_model_input_formats(fmt):
    if fmt == "unpack_dict":
        model, dataset = DictModel(), DictData(regression())
        loss = lambda data, out: nn.functional.mse_loss(out, data["label"])  # noqa: E731
    else:
        model, dataset, loss = DictModel(), regression(), mse
    status, result, _ = auto_accelerate(model, **common(dataset=dataset, loss_func=loss), model_input_format=fmt,
                                        load_strategy=["parallel_mode"], ignore_dryrun_on_load_strategy=False)
    assert status
    losses = train(result, epochs=2, fmt=fmt)
    assert losses[-1] < losses[0]


def test_custom_optim_func_prepare_input_and_tuple_losses():
    calls = []

    def optim_func(parameters, **optim_args):
        return torch.optim.SGD(parameters, **optim_args)

    def prepare_input(data, device):
        calls.append(device)
        return data[0].to(device), data[1].to(device)

    def loss_func(data, out):
        loss = mse(data, out)
        return loss, {"mse": loss.detach()}

    status, result, _ = auto_accelerate(TupleModel(BlockNet()), **common(optim_func=optim_func, loss_func=loss_func,
                                                                        optim_args={"lr": 0.05, "momentum": 0.9}),
                                        prepare_input=prepare_input, load_strategy=[("amp_native", "fp16")])
    assert status and calls == []
    losses = train(result, epochs=2)
    assert calls and losses[-1] < losses[0]


def test_bad_arguments_are_named():
    model = TupleModel(BlockNet())
    with pytest.raises(UnknownMethodError, match="did you mean 'parallel_mode'"):
        auto_accelerate(model, **common(), load_strategy=["paralle_mode", ("amp_native", "bf16")])
    with pytest.raises(ConfigError, match="config of 'half'"):
        auto_accelerate(model, **common(), load_strategy=[("half", "fp8")])
    with pytest.raises(UnavailableMethodError, match="'fsdp', which cannot apply here.*skip_unavailable=True"):
        auto_accelerate(model, **common(), load_strategy=["fsdp"])
    with pytest.raises(AccelerateError, match="model_input_format must be"):
        auto_accelerate(model, **common(), model_input_format="kwargs", load_strategy=[])
    with pytest.raises(AccelerateError, match="model must be a torch.nn.Module"):
        auto_accelerate(lambda x: x, **common(), load_strategy=[])
    with pytest.raises(AccelerateError, match=r'dataloader_args\["batch_size"\]'):
        auto_accelerate(model, **common(dataloader_args={"batch_size": 0}), load_strategy=[])
    with pytest.raises(AccelerateError, match="dataloader_args has 'batchsize'"):
        auto_accelerate(model, **common(dataloader_args={"batchsize": 8}), load_strategy=[])
    with pytest.raises(AccelerateError, match="excluded: unknown optimization method 'amp'"):
        auto_accelerate(model, **common(), excluded=["amp"], load_strategy=[])
    with pytest.raises(TypeError, match="unexpected keyword argument 'verbosity'"):
        auto_accelerate(model, **common(), load_strategy=[], verbosity=True)
    with pytest.raises(AccelerateError, match="optim_func.*failed.*lrr"):
        auto_accelerate(model, **common(optim_args={"lrr": 0.1}), load_strategy=[])


def test_a_non_scalar_loss_and_a_wrongly_structured_dataset_are_named():
    per_sample = lambda data, out: (out - data[1]) ** 2  # noqa: E731
    with pytest.raises(AccelerateError, match=r"loss_func must return a scalar loss.*shape \(32, 1\)"):
        auto_accelerate(TupleModel(BlockNet()), **common(loss_func=per_sample), load_strategy=["parallel_mode"],
                        ignore_dryrun_on_load_strategy=False)
    _, result, _ = auto_accelerate(TupleModel(BlockNet()), **common(loss_func=per_sample), load_strategy=[])
    with pytest.raises(AccelerateError, match="loss_func must return a scalar"):
        train(result, epochs=1)
    with pytest.raises(AccelerateError, match="model_input_format='unpack_dict'.*the dataset.*gave a list"):
        auto_accelerate(DictModel(), **common(), model_input_format="unpack_dict", load_strategy=[],
                        ignore_dryrun_on_load_strategy=False)


def test_a_failing_dry_run_gives_status_false(caplog):
    class Broken(nn.Module):
        def forward(self, batch):
            raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR):
        status, result, best = auto_accelerate(Broken(), **common(optim_func=None), load_strategy=["parallel_mode"],
                                               ignore_dryrun_on_load_strategy=False, sample_batch=1)
    # no optim_func: the dry run is skipped (as ATorch), the strategy applies
    assert status
    params = nn.Linear(1, 1)
    model = nn.Sequential(params)
    model.forward = lambda batch: (_ for _ in ()).throw(RuntimeError("boom"))
    with caplog.at_level(logging.ERROR):
        status, result, best = auto_accelerate(model, **common(), load_strategy=["parallel_mode"],
                                               ignore_dryrun_on_load_strategy=False)
    assert (status, result, best) == (False, None, None)
    assert "the model's forward (model_input_format=None) raised RuntimeError: boom" in caplog.text


def test_finetune_tries_variations_and_keeps_one_that_runs():
    status, result, best = auto_accelerate(TupleModel(BlockNet()), **common(),
                                           load_strategy=[("amp_native", "bf16"), ("checkpoint", (Block,))],
                                           finetune_strategy=True, dry_run_steps=2)
    assert status
    tried = result.args.tried
    assert len(tried) == 3 and all(r.ok for r in tried)  # loaded, fp16 amp, reentrant checkpoint
    assert best in [r.strategy for r in tried]
    assert train(result, epochs=1)


def test_fully_automatic_mode_needs_what_a_dry_run_needs():
    with pytest.raises(AccelerateError, match="fully automatic mode.*need optim_func"):
        auto_accelerate(TupleModel(BlockNet()), **common(optim_func=None))


def test_the_atorch_import_path_is_the_same_function():
    from flextrain.compat import atorch

    assert atorch.auto_accelerate is auto_accelerate and atorch.Strategy is Strategy
