"""Strategies: the accepted forms, canonical configs, JSON round trips, and clear errors."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from accel_models import Block
from flextrain.accelerate import AccelerateError, ConfigError, Strategy, UnknownMethodError, conflict
from flextrain.accelerate.codec import resolve_class


def test_the_reference_example_and_its_canonical_configs():
    s = Strategy(["parallel_mode", ("amp_native", "bf16")])
    assert s.names == ("parallel_mode", "amp_native")
    assert s.config("amp_native") == {"dtype": "bf16", "skip_if_nonfinite": False}
    # ATorch's code spellings mean the same strategy
    assert s == Strategy([("parallel_mode", None), ("amp_native", {"dtype": torch.bfloat16})])
    assert Strategy([("amp_native", None)]).config("amp_native") == {"dtype": "fp16", "skip_if_nonfinite": True}
    assert Strategy(["half"]).config("half") == "fp16" and Strategy([("half", torch.bfloat16)]).config("half") == "bf16"
    assert Strategy([("parallel_mode", ([("data", 8)], None))]).config("parallel_mode") == ([("data", 8)], None)
    assert Strategy(["compile"]).names == ("native_dynamo",) and "compile" in Strategy(["native_dynamo"])
    assert Strategy([("checkpoint", (Block,))]).config("checkpoint") == {"wrap_class": (Block,), "no_reentrant": True}
    assert Strategy([("checkpoint", {"wrap_class": "Block", "no_reentrant": False})]).config("checkpoint") == \
        {"wrap_class": ("Block",), "no_reentrant": False}
    assert Strategy([("native_dynamo", {"dynamo_backend": "INDUCTOR"})]).config("compile") == {"backend": "inductor"}


def test_json_round_trips_with_classes_dtypes_and_tuples(tmp_path):
    s = Strategy(["parallel_mode", ("amp_native", {"dtype": torch.float16}), ("checkpoint", (Block, torch.nn.Linear)),
                  ("fsdp2", {"atorch_wrap_cls": (Block,), "param_dtype": torch.bfloat16}), "module_replace"])
    text = s.to_json()
    doc = json.loads(text)
    assert doc["methods"][2]["config"]["wrap_class"] == [{"__class__": "accel_models:Block"},
                                                         {"__class__": "torch.nn.modules.linear:Linear"}]
    assert Strategy.from_json(text) == s
    assert Strategy.load(text) == s and Strategy.load(text.encode()) == s
    path = s.save(tmp_path / "strategy.json")
    assert Strategy.load(str(path)) == s and Strategy.load(path) == s
    # a bare JSON list is a strategy too
    assert Strategy.load('["parallel_mode", ["amp_native", "bf16"]]') == Strategy(["parallel_mode", ("amp_native", "bf16")])


def test_classes_load_only_from_torch_or_modules_already_imported():
    assert resolve_class("torch.nn.modules.linear:Linear") is torch.nn.Linear
    text = json.dumps({"format": "flextrain.accelerate.strategy/1",
                       "methods": [{"name": "checkpoint", "config": {"wrap_class": [{"__class__": "antigravity:Fly"}]}}]})
    with pytest.raises(ConfigError, match="'antigravity' is not imported"):
        Strategy.from_json(text)
    with pytest.raises(ConfigError, match="not a class path"):
        resolve_class("os:system.__globals__")
    with pytest.raises(ConfigError, match="not a class"):
        resolve_class("torch:add")


def test_pickled_strategies_are_refused_not_unpickled():
    with pytest.raises(AccelerateError, match="never unpickles"):
        Strategy.load(pickle.dumps([("amp_native", "bf16")]))


def test_unknown_names_bad_configs_and_conflicts_name_the_culprit(tmp_path):
    with pytest.raises(UnknownMethodError, match=r"load_strategy\[0\]: unknown optimization method 'paralle_mode'; "
                                                 r"did you mean 'parallel_mode'\?"):
        Strategy(["paralle_mode", ("amp_native", "bf16")])
    with pytest.raises(ConfigError, match="config of 'amp_native' needs dtype 'fp16' or 'bf16'"):
        Strategy([("amp_native", "fp8")])
    with pytest.raises(ConfigError, match="config of 'amp_native' has an unknown key 'dtyp'"):
        Strategy([("amp_native", {"dtyp": "bf16"})])
    with pytest.raises(ConfigError, match="data parallelism only"):
        Strategy([("parallel_mode", ([("tensor", 2), ("data", 2)], None))])
    with pytest.raises(ConfigError, match="needs the module classes"):
        Strategy(["checkpoint"])
    with pytest.raises(ConfigError, match="DeepSpeed"):
        Strategy([("zero1", {"use_ds_zero": True})])
    with pytest.raises(ConfigError, match="takes no config"):
        Strategy([("channels_last", 4)])
    with pytest.raises(AccelerateError, match="'amp_native' and 'half' cannot be combined"):
        Strategy(["amp_native", "half"])
    with pytest.raises(AccelerateError, match="'native_dynamo' appears twice"):
        Strategy(["native_dynamo", "compile"])
    with pytest.raises(AccelerateError, match=r"load_strategy\[1\] must be a method name or a \(name, config\) pair"):
        Strategy(["half", ("checkpoint", (Block,), True)])
    with pytest.raises(AccelerateError, match="cannot read strategy file"):
        Strategy.load(str(tmp_path / "missing.json"))
    with pytest.raises(AccelerateError, match="load_strategy must be a list"):
        Strategy.load(42)
    assert conflict(["zero1", "fsdp2"]) == "'zero1' and 'fsdp2' cannot be combined (both are sharding methods)"
    assert conflict(["parallel_mode", "fsdp2", "amp_native"]) is None


def test_strategies_combine_and_vary():
    s = Strategy(["parallel_mode", ("amp_native", "bf16")])
    assert (s + [("amp_native", "fp16"), "compile"]).names == ("parallel_mode", "amp_native", "native_dynamo")
    assert (s + ["compile"]).config("amp_native")["dtype"] == "bf16"
    assert s.with_step("amp_native", "fp16").config("amp_native")["dtype"] == "fp16"
    assert s.without("amp_native").names == ("parallel_mode",)
    variations = Strategy([("amp_native", "bf16"), ("checkpoint", (Block,))]).variations()
    assert [v.config("amp_native")["dtype"] for v in variations] == ["fp16", "bf16"]
    assert [v.config("checkpoint")["no_reentrant"] for v in variations] == [True, False]
    assert "[1] amp_native : {'dtype': 'bf16'" in str(s) and hash(s) == hash(Strategy(["parallel_mode", "amp_native"]))
