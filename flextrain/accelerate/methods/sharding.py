"""Sharded data parallelism: ``fsdp`` (ZeRO-3, FSDP1), ``fsdp2`` (ZeRO-3, ``fully_shard``), ``zero2``.

- ``fsdp``: ``FullyShardedDataParallel`` with ATorch's config: FSDP's keyword arguments
  (``sharding_strategy`` by name, ``cpu_offload`` as a bool, ``backward_prefetch`` by name,
  ``forward_prefetch``, ``limit_all_gathers``, ``use_orig_params``, ``sync_module_states``) plus
  ``atorch_wrap_cls`` (classes or class names wrapped as FSDP units),
  ``atorch_size_based_min_num_params`` and ``atorch_ignored_cls``. torch 2.13's FSDP1 needs an
  accelerator ("FSDP needs a non-CPU accelerator device" on CPU): ``check`` refuses the CPU.
- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every ``atorch_wrap_cls`` module and the
  root; config ``atorch_wrap_cls``, ``reshard_after_forward``, ``param_dtype``/``reduce_dtype``
  (a MixedPrecisionPolicy). Runs on CPU with gloo.
- ``zero2``: ZeRO-2 (gradients and optimizer state sharded, parameters kept whole from forward
  to backward). On CUDA, as ATorch: FSDP1 with ``SHARD_GRAD_OP`` and the ``fsdp`` config; on CPU,
  ``fully_shard(reshard_after_forward=False)`` with ``atorch_wrap_cls`` (FSDP1's performance
  switches have no meaning there and are ignored, with a note).

All need more than one process. ``fsdp2``/``zero2`` broadcast rank 0's weights first (as DDP
does), so every process starts from the same model.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from flextrain.accelerate.methods.base import Method, Phase, half_dtype_name, HALF_DTYPES, matches, module_classes
from flextrain.accelerate.methods.registry import register

_WRAP_KEYS = ("atorch_wrap_cls", "atorch_size_based_min_num_params", "atorch_ignored_cls")
_FSDP1_KEYS = ("sharding_strategy", "cpu_offload", "backward_prefetch", "forward_prefetch", "limit_all_gathers",
               "use_orig_params", "sync_module_states")
_FSDP2_KEYS = ("atorch_wrap_cls", "reshard_after_forward", "param_dtype", "reduce_dtype")


def _broadcast_from_rank0(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def _fully_shard(model: torch.nn.Module, classes: tuple[type | str, ...], *, reshard_after_forward: bool,
                 mp_policy: Any = None) -> None:
    from torch.distributed.fsdp import fully_shard

    kwargs = {"reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    _broadcast_from_rank0(model)
    for module in reversed(list(model.modules())):  # children before parents
        if module is not model and classes and matches(module, classes):
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)


class _FSDP1Config(Method):
    """Validation of ATorch's FSDP config (shared by fsdp and zero2)."""

    def validate(self, config: Any) -> Any:
        out = self.dict_config(config, dict.fromkeys(_WRAP_KEYS + _FSDP1_KEYS))
        for key in ("atorch_wrap_cls", "atorch_ignored_cls"):
            if key in out:
                out[key] = module_classes(self, out[key], config, key=key)
        if "atorch_wrap_cls" in out and "atorch_size_based_min_num_params" in out:
            raise self.config_error(config, "has both atorch_wrap_cls and atorch_size_based_min_num_params: give one")
        n = out.get("atorch_size_based_min_num_params")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise self.config_error(config, "atorch_size_based_min_num_params must be a positive integer")
        from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

        for key, enum in (("sharding_strategy", ShardingStrategy), ("backward_prefetch", BackwardPrefetch)):
            if key in out:
                value = out[key]
                name = value.name if isinstance(value, enum) else value
                if name not in enum.__members__:
                    raise self.config_error(config, f"{key} must be one of {', '.join(enum.__members__)}")
                out[key] = name
        for key in ("cpu_offload", "forward_prefetch", "limit_all_gathers", "use_orig_params", "sync_module_states"):
            if key in out and not isinstance(out[key], bool):
                raise self.config_error(config, f"{key} must be True or False")
        return out or None

    def check(self, model: torch.nn.Module, device: torch.device, world: Any, config: Any = None) -> str | None:
        return super().check(model, device, world, config) or (
            None if device.type == "cuda" else
            "torch 2.13's FullyShardedDataParallel (FSDP1) needs a CUDA device (on the CPU it raises 'FSDP needs "
            "a non-CPU accelerator device'): use fsdp2 (fully_shard), which runs on the CPU with gloo")

    def wrap_fsdp1(self, ctx: Any, config: Any, **defaults: Any) -> None:
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy, lambda_auto_wrap_policy, size_based_auto_wrap_policy

        kwargs = {**defaults, **dict(config or {})}
        model = ctx.model
        wrap = kwargs.pop("atorch_wrap_cls", None)
        if wrap is not None:
            classes = tuple(wrap)
            if all(isinstance(c, type) for c in classes):
                kwargs["auto_wrap_policy"] = ModuleWrapPolicy(set(classes))
            else:
                kwargs["auto_wrap_policy"] = functools.partial(lambda_auto_wrap_policy,
                                                               lambda_fn=lambda m: matches(m, classes))
        n = kwargs.pop("atorch_size_based_min_num_params", None)
        if n is not None:
            kwargs["auto_wrap_policy"] = functools.partial(size_based_auto_wrap_policy, min_num_params=n)
        ignored = kwargs.pop("atorch_ignored_cls", None)
        if ignored is not None:
            kwargs["ignored_modules"] = [m for m in model.modules() if matches(m, tuple(ignored))]
        if "sharding_strategy" in kwargs:
            kwargs["sharding_strategy"] = ShardingStrategy[kwargs["sharding_strategy"]]
        if "backward_prefetch" in kwargs:
            kwargs["backward_prefetch"] = BackwardPrefetch[kwargs["backward_prefetch"]]
        if "cpu_offload" in kwargs:
            kwargs["cpu_offload"] = CPUOffload(offload_params=kwargs["cpu_offload"])
        ctx.model = ctx.core = FSDP(model, device_id=ctx.device, **kwargs)
        ctx.sharded_by = self.name


@register
class FSDP(_FSDP1Config):
    name, phase, group, distributed = "fsdp", Phase.SHARD, "sharding", True
    summary = "ZeRO-3: FullyShardedDataParallel (FSDP1, CUDA), ATorch's config keys"

    def apply(self, ctx: Any, config: Any) -> None:
        self.wrap_fsdp1(ctx, config)


@register
class Zero2(_FSDP1Config):
    name, phase, group, distributed = "zero2", Phase.SHARD, "sharding", True
    summary = "ZeRO-2: gradients and optimizer state sharded (FSDP1 SHARD_GRAD_OP on CUDA, fully_shard on CPU)"

    def validate(self, config: Any) -> Any:
        out = dict(config) if isinstance(config, dict) else config
        if isinstance(out, dict):
            for key in ("not_use_fsdp", "use_ds_zero"):
                if out.pop(key, False):
                    raise self.config_error(config, f"asks for {key} (fairscale / DeepSpeed), which flextrain does not "
                                                    "include: zero2 is torch's FSDP")
            if "sharding_strategy" in out:
                raise self.config_error(config, "sets sharding_strategy: zero2 is SHARD_GRAD_OP (use fsdp for others)")
        return super().validate(out)

    def check(self, model: torch.nn.Module, device: torch.device, world: Any, config: Any = None) -> str | None:
        return Method.check(self, model, device, world, config)

    def apply(self, ctx: Any, config: Any) -> None:
        if ctx.device.type == "cuda":
            self.wrap_fsdp1(ctx, config, sharding_strategy="SHARD_GRAD_OP")
            return
        ignored = sorted(set(config or {}) - {"atorch_wrap_cls"})
        if ignored:
            ctx.note(f"zero2 on the CPU runs fully_shard(reshard_after_forward=False); FSDP1 settings ignored: "
                     f"{', '.join(ignored)}")
        _fully_shard(ctx.model, tuple((config or {}).get("atorch_wrap_cls", ())), reshard_after_forward=False)
        ctx.sharded_by = self.name


@register
class FSDP2(Method):
    name, phase, group, distributed = "fsdp2", Phase.SHARD, "sharding", True
    summary = "ZeRO-3 with torch.distributed.fsdp.fully_shard (FSDP2); runs on CPU/gloo and CUDA"

    def validate(self, config: Any) -> Any:
        out = self.dict_config(config, dict.fromkeys(_FSDP2_KEYS))
        if "atorch_wrap_cls" in out:
            out["atorch_wrap_cls"] = module_classes(self, out["atorch_wrap_cls"], config, key="atorch_wrap_cls")
        if "reshard_after_forward" in out and not isinstance(out["reshard_after_forward"], bool):
            raise self.config_error(config, "reshard_after_forward must be True or False")
        for key in ("param_dtype", "reduce_dtype"):
            if key in out:
                out[key] = "fp32" if out[key] in ("fp32", "float32", torch.float32) else \
                    half_dtype_name(self, out[key], config)
        return out or None

    def apply(self, ctx: Any, config: Any) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        cfg = dict(config or {})
        dtypes = {**HALF_DTYPES, "fp32": torch.float32}
        mp = None
        if "param_dtype" in cfg or "reduce_dtype" in cfg:
            mp = MixedPrecisionPolicy(param_dtype=dtypes.get(cfg.get("param_dtype")),
                                      reduce_dtype=dtypes.get(cfg.get("reduce_dtype")))
        _fully_shard(ctx.model, tuple(cfg.get("atorch_wrap_cls", ())),
                     reshard_after_forward=cfg.get("reshard_after_forward", True), mp_policy=mp)
        ctx.sharded_by = self.name


__all__ = ["FSDP", "FSDP2", "Zero2"]
