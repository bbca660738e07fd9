"""``--accelerate`` as jobs read it (flextrain/accelerate/jobs.py): auto, inline JSON, the comma list and its
config shorthand; the methods a job refuses, each named with why; descriptions that resolve no class."""

from __future__ import annotations

import pytest

from flextrain.accelerate import AccelerateError, ConfigError, Strategy, UnknownMethodError
from flextrain.accelerate.jobs import applied_in_jobs, check_setting, describe, describe_json, parse_setting


@pytest.mark.parametrize("text, expected", [
    ("amp_native:bf16", Strategy([("amp_native", "bf16")])),
    (" half:bf16 , channels_last ", Strategy([("half", "bf16"), "channels_last"])),
    ("checkpoint:Block+Linear", Strategy([("checkpoint", ("Block", "Linear"))])),
    ("compile:eager", Strategy([("native_dynamo", {"backend": "eager"})])),
    ("module_replace:MultiheadAttention_SDPA", Strategy([("module_replace", ["MultiheadAttention_SDPA"])])),
    ('["tf32", ["amp_native", "bf16"]]', Strategy(["tf32", ("amp_native", "bf16")])),
    (Strategy([("half", "fp16")]).to_json(), Strategy([("half", "fp16")])),
])
def test_the_forms_of_the_setting(text, expected):
    assert parse_setting(text) == expected
    assert check_setting(text) == expected


def test_auto_is_no_strategy_yet():
    assert parse_setting("auto") is None and check_setting(" auto ") is None


def test_parallel_mode_and_auto_ddp_are_accepted_and_not_applied():
    strategy = check_setting("parallel_mode,auto_ddp,amp_native:bf16")
    assert strategy.names == ("parallel_mode", "auto_ddp", "amp_native")
    assert applied_in_jobs(strategy) == Strategy([("amp_native", "bf16")])


@pytest.mark.parametrize("text, kind, needles", [
    ("amp_natve:bf16", UnknownMethodError, ["--accelerate: unknown optimization method 'amp_natve'",
                                            "did you mean 'amp_native'"]),
    ("half:bf17", ConfigError, ["--accelerate: config of 'half' needs dtype 'fp16' or 'bf16'"]),
    ("checkpoint", ConfigError, ["config of 'checkpoint' needs the module classes"]),
    ("channels_last:x", ConfigError, ["config of 'channels_last' takes no config"]),
    ("amp_native:bf16,,half", AccelerateError, ["an empty method name"]),
    ("half:", AccelerateError, ["'half' has an empty config"]),
    ("amp_native:bf16,half:bf16", AccelerateError, ["'amp_native' and 'half' cannot be combined"]),
    ("strategies/fast.json", AccelerateError, ["looks like a file", "flextrain train --accelerate FILE"]),
    ('{"methods": [}', AccelerateError, ["--accelerate is not a JSON strategy"]),
    ("", AccelerateError, ["--accelerate must be 'auto', a JSON strategy or a comma list"]),
])
def test_bad_settings_name_the_method_and_the_problem(text, kind, needles):
    with pytest.raises(kind) as info:
        check_setting(text)
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize("method", ["zero1", "zero2", "fsdp", "fsdp2"])
def test_data_parallel_methods_are_refused_naming_them_and_why(method):
    with pytest.raises(AccelerateError) as info:
        check_setting(f"amp_native:bf16,{method}", what="spec.training.accelerate")
    message = str(info.value)
    assert message.startswith(f"spec.training.accelerate: {method} (")
    assert "flextrain's own in a job" in message and "every record applied once" in message


@pytest.mark.parametrize("text, needle", [
    ("amp_native", "amp_native with fp16 (also its default"),
    ("amp_native:fp16", "in a job a skipped step would drop its records"),
    ('[["amp_native", {"dtype": "bf16", "skip_if_nonfinite": true}]]', "follow --nan-policy"),
])
def test_amp_that_skips_steps_is_refused(text, needle):
    with pytest.raises(AccelerateError, match="--accelerate: ") as info:
        check_setting(text)
    assert needle in str(info.value)


def test_descriptions_use_the_shorthand_and_resolve_no_class():
    strategy = check_setting("amp_native:bf16,checkpoint:Block,compile:eager")
    assert describe(strategy) == "amp_native:bf16, checkpoint:Block, native_dynamo:eager"
    assert describe(Strategy()) == "no methods"
    saved = ('{"format": "flextrain.accelerate.strategy/1", "methods": [{"name": "checkpoint", "config": '
             '{"wrap_class": [{"__class__": "my_model_not_imported:Block"}], "no_reentrant": true}}, '
             '{"name": "native_dynamo", "config": {"backend": "inductor", "mode": "default"}}]}')
    assert describe_json(saved) == ('checkpoint:Block, native_dynamo:{"backend":"inductor","mode":"default"}')
