"""auto_accelerate's fully automatic mode: the search by dry runs, its rules, its time limit, its table.

The model whose best strategy is known on any machine: an MLP of LoopLinear layers (a Linear that
multiplies sample by sample in a Python loop) with a registered replacement pair, so that
``module_replace`` makes it many times faster (measured on the 2-core development machine with
one torch thread: 4x to 30x over single dry runs, 10x and more as the best of two).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from accel_models import BlockNet, ConvNet, TupleModel, loop_net, mse, regression, register_loop_pair, train
from flextrain.accelerate import AccelerateError, Method, Phase, Strategy, UnavailableMethodError, auto_accelerate
from flextrain.accelerate.methods import registry
from flextrain.accelerate.methods.replace import REPLACEMENT_PAIRS
from flextrain.accelerate.results import PICKED, REJECTED, TIME_LIMIT, describe_step
from flextrain.accelerate.search import _next_level, base_strategy, single_steps
from flextrain.accelerate.strategy import Step
from flextrain.elastic.world import World, WorldSource


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine two OpenMP threads stall each other for whole steps."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def loop_pair():
    """LoopLinear -> FastLinear registered for module_replace, for one test only."""
    saved = dict(REPLACEMENT_PAIRS)
    register_loop_pair()
    yield
    REPLACEMENT_PAIRS.clear()
    REPLACEMENT_PAIRS.update(saved)


@pytest.fixture
def register(monkeypatch):
    """Register a test method for one test only."""
    def add(cls):
        method = cls()
        monkeypatch.setitem(registry._methods, method.name, method)
        monkeypatch.setitem(registry._aliases, method.name, method.name)
        return method
    return add


class _FiveTimesTheLearningRate(Method):
    """Breaks training: the optimizer steps with 5x the learning rate."""

    name, phase = "test_search_lr_x5", Phase.CAST

    def apply(self, ctx, config):
        def wrap(opt):
            for group in opt.param_groups:
                group["lr"] *= 5
            return opt
        ctx.optimizer_wrappers.append(wrap)


class _Raises(Method):
    name, phase = "test_search_raises", Phase.CAST

    def apply(self, ctx, config):
        raise RuntimeError("this method cannot apply to anything")


class _Sleepy(Method):
    """Slows every forward by 0.25 s (a dry run of it takes 1.75 s and more, on any machine)."""

    name, phase = "test_search_sleepy", Phase.CAST

    def apply(self, ctx, config):
        ctx.model.register_forward_pre_hook(lambda module, args: time.sleep(0.25))


def world(n, rank=0):
    return World(processes=n, rank=rank, devices_per_process=1, source=WorldSource.ENVIRONMENT)


def common(**kw):
    kw.setdefault("optim_func", torch.optim.SGD)
    kw.setdefault("dataset", regression(512))
    kw.setdefault("loss_func", mse)
    kw.setdefault("optim_args", {"lr": 0.05})
    kw.setdefault("dataloader_args", {"batch_size": 64})
    kw.setdefault("excluded", ["native_dynamo"])  # compiling costs seconds a candidate (the example tries it)
    return kw


def accepted(search):
    return [c for c in search.candidates if c.accepted]


def test_the_search_picks_the_fastest_accepted_candidate_and_rejects_broken_ones(loop_pair, register):
    register(_FiveTimesTheLearningRate)
    register(_Raises)
    torch.manual_seed(0)
    status, result, best = auto_accelerate(TupleModel(loop_net()), **common())
    assert status
    search = result.args.search
    assert search is not None and result.args.strategy == best and search.chosen.strategy == best
    assert "module_replace" in best.names
    # the pick is the highest figure among the accepted candidates of this search
    fastest = max(accepted(search), key=lambda c: c.samples_per_second)
    assert fastest.status == PICKED and fastest.strategy == best
    assert search.speedup(fastest) >= 3.0  # measured: 4x-30x per run, 10x and more as a best of two
    rows = {r["label"]: r for r in search.rows()}
    assert rows["plain"]["runs"] == 2 and rows["plain"]["vs_plain"] == 1.0
    assert rows["test_search_lr_x5"]["status"] == REJECTED and "loss at step 2" in rows["test_search_lr_x5"]["reason"]
    assert rows["test_search_raises"]["status"] == REJECTED
    assert "applying it failed: RuntimeError" in rows["test_search_raises"]["reason"]
    assert not any("native_dynamo" in r["methods"] for r in rows.values())
    assert all(r["status"] != TIME_LIMIT for r in rows.values()) and not search.stopped_early
    assert 0 < search.elapsed < search.time_limit == 300.0
    assert result.args.dry_run is fastest.best_run and len(result.args.tried) == sum(len(c.runs)
                                                                                     for c in search.candidates)
    assert "auto_accelerate search:" in str(result.args) and "picked" in str(result.args)
    assert type(result.model.inner[0]).__name__ == "FastLinear"  # the user's model, as the strategy applied it
    losses = train(result, epochs=2)
    assert losses[-1] < losses[0]


def test_a_small_time_limit_stops_the_search_early_and_keeps_the_best_so_far(loop_pair, register):
    register(_Sleepy)
    torch.manual_seed(0)
    limit = 1.0
    status, result, best = auto_accelerate(TupleModel(loop_net()), **common(), time_limit=limit)
    assert status
    search = result.args.search
    assert search.stopped_early and search.time_limit == limit
    limited = [c for c in search.candidates if c.status == TIME_LIMIT]
    assert limited and all(c.samples_per_second is None for c in limited)
    assert any("test_search_sleepy" in c.strategy.names for c in limited)  # it cannot finish in 1 s
    # the plain runs always complete; after them the search ends within a step (0.25 s here) of the limit
    assert search.elapsed <= max(limit, search.plain.seconds) + 1.0
    fastest = max(accepted(search), key=lambda c: c.samples_per_second)
    assert fastest.status == PICKED and fastest.strategy == best


def test_excluded_and_included_are_respected(loop_pair):
    torch.manual_seed(0)
    status, result, best = auto_accelerate(TupleModel(loop_net()), **common(excluded=["module_replace",
                                                                                      "native_dynamo"]))
    assert status and "module_replace" not in best.names
    assert not any("module_replace" in c.strategy.names for c in result.args.search.candidates)
    status, result, best = auto_accelerate(TupleModel(loop_net()), **common(), included=["half"])
    assert status and best.config("half") == "bf16"
    candidates = result.args.search.candidates
    assert all("half" in c.strategy.names for c in candidates[1:])  # all but the plain run
    assert not any("amp_native" in c.strategy.names for c in candidates)  # half excludes amp_native


def test_included_and_excluded_mistakes_are_named():
    model = TupleModel(BlockNet())
    with pytest.raises(AccelerateError, match="half cannot be both excluded and included"):
        auto_accelerate(model, **common(excluded=["half"]), included=["half"])
    with pytest.raises(AccelerateError, match="included: 'half' and 'amp_native' cannot be combined"):
        auto_accelerate(model, **common(), included=["half", "amp_native"])
    with pytest.raises(UnavailableMethodError, match="channels_last"):
        auto_accelerate(model, **common(), included=["channels_last"])
    with pytest.raises(AccelerateError, match="included: 'checkpoint' needs a config the search cannot choose"):
        auto_accelerate(TupleModel(loop_net()), **common(), included=["checkpoint"])
    with pytest.raises(AccelerateError, match="parallel_mode .* cannot be excluded"):
        base_strategy(model, torch.device("cpu"), world(2), excluded=["parallel_mode"])
    status, result, _ = auto_accelerate(model, **common(), included=["channels_last"], skip_unavailable=True,
                                        time_limit=5)
    assert status and [s.name for s in result.args.skipped] == ["channels_last"]


def test_candidates_per_world_and_device():
    cpu = torch.device("cpu")
    base, _ = base_strategy(BlockNet(), cpu, world(1))
    assert base == Strategy([])
    one = [describe_step(s) for s in single_steps(ConvNet(), cpu, world(1), base)]
    assert {"amp_native(bf16)", "half(bf16)", "channels_last"} <= set(one)
    assert not {"parallel_mode", "auto_ddp", "zero1", "zero2", "fsdp", "fsdp2", "tf32"} & set(one)
    assert one[-1] == "native_dynamo"  # compiled candidates last
    assert "checkpoint(Block)" in [describe_step(s) for s in single_steps(BlockNet(), cpu, world(1), base)]
    base2, _ = base_strategy(BlockNet(), cpu, world(2), included=["amp_native"])
    assert base2.names == ("parallel_mode", "amp_native")
    two = {s.name for s in single_steps(BlockNet(), cpu, world(2), base2, excluded=["zero1"])}
    assert {"zero2", "fsdp2", "checkpoint"} <= two and not {"fsdp", "zero1", "half", "amp_native", "parallel_mode",
                                                           "auto_ddp"} & two


def test_combinations_grow_only_from_parts_that_all_helped():
    singles = [Step("module_replace", None), Step("half", "bf16"), Step("amp_native", {"dtype": "bf16"}),
               Step("channels_last", None), Step("native_dynamo", None)]
    # singles 0, 1, 2 and 4 helped, 3 did not; half and amp_native (1, 2) are never combined
    pairs = _next_level([(0,), (1,), (2,), (4,)], [0, 1, 2, 4], singles)
    assert pairs == [(0, 1), (0, 2), (0, 4), (1, 4), (2, 4)]  # compiled ones last
    triples = _next_level([(0, 1), (0, 4)], [0, 1, 4], singles)
    assert triples == []  # (1, 4) did not help, so (0, 1, 4) is not tried
    assert _next_level([(0, 1), (0, 4), (1, 4)], [0, 1, 4], singles) == [(0, 1, 4)]


def test_verbose_prints_the_table_and_the_pick_is_saved_as_json(loop_pair, capsys, tmp_path):
    torch.manual_seed(0)
    status, result, best = auto_accelerate(TupleModel(loop_net()), **common(), verbose=True,
                                           save_strategy_to_file=str(tmp_path / "auto.json"))
    assert status
    out = capsys.readouterr().out
    for word in ("auto_accelerate search", "methods", "samples/s", "peak memory", "status", "picked", "plain",
                 "module_replace"):
        assert word in out
    assert Strategy.load(str(tmp_path / "auto.json")) == best
    assert json.loads((tmp_path / "auto.json").read_text())["methods"][0]["name"] == best.names[0]
    text = result.args.search.table()
    assert text.splitlines()[1].split()[:3] == ["methods", "samples/s", "vs"]



def test_an_included_method_that_breaks_training_gives_status_false(register, caplog):
    register(_FiveTimesTheLearningRate)
    status, result, best = auto_accelerate(TupleModel(BlockNet()), **common(), included=["test_search_lr_x5"],
                                           time_limit=10)
    assert (status, result, best) == (False, None, None)  # never the plain run, which lacks it
    assert "loss at step 2" in caplog.text
