"""Data parallelism: ``parallel_mode``, ``auto_ddp`` (DDP over the process group) and ``zero1``.

- ``parallel_mode``: ATorch's config ``([("data", n)], None)`` (None: the whole world). Only data
  parallelism exists here (no tensor/pipeline groups, no custom rank order); as in ATorch, the
  data size is adjusted to the world, and a world of one process makes it a no-op. With more
  processes the model is wrapped in ``DistributedDataParallel`` (unless a sharding method holds it).
- ``auto_ddp``: DDP when the world has more than one process; config: DDP keyword arguments
  (``{"find_unused_parameters": True, "bucket_cap_mb": 50, ...}``).
- ``zero1``: torch's ``ZeroRedundancyOptimizer`` (optimizer state sharded over the processes) with
  DDP for the gradients; config: its keyword arguments (``{"parameters_as_bucket_view": True}``).
  ATorch's ``{"use_ds_zero": True}`` (DeepSpeed) is refused.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from flextrain.accelerate.methods.base import Method, Phase
from flextrain.accelerate.methods.registry import register

_DDP_KEYS = frozenset(inspect.signature(DistributedDataParallel.__init__).parameters) - {
    "self", "module", "device_ids", "output_device", "process_group", "device_mesh"}


@register
class ParallelMode(Method):
    name, phase = "parallel_mode", Phase.DATA_PARALLEL
    summary = "data parallelism over the process group: DDP (ATorch's config ([('data', n)], None))"

    def validate(self, config: Any) -> Any:
        if config is None:
            return None
        if not isinstance(config, list | tuple) or len(config) not in (2, 3):
            raise self.config_error(config, 'must be ([("data", size)], None)')
        groups, ranks = config[0], config[1]
        if ranks is not None:
            raise self.config_error(config, "has a custom rank order: only None (sequential ranks) is supported")
        if not isinstance(groups, list | tuple) or len(groups) != 1:
            raise self.config_error(config, 'must name one group, ("data", size): flextrain has data parallelism '
                                            "only (no tensor, pipeline or zero groups)")
        group = groups[0]
        if not isinstance(group, list | tuple) or len(group) != 2 or group[0] != "data":
            raise self.config_error(config, 'must name one group, ("data", size): flextrain has data parallelism '
                                            f"only, got group {group!r}")
        size = group[1]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise self.config_error(config, f"needs a positive data size, got {size!r}")
        return ([("data", size)], None)

    def candidates(self, model: torch.nn.Module, device: torch.device, world: Any) -> tuple[Any, ...]:
        # A no-op in a world of one process; with more, the search puts it in every candidate.
        return (None,) if world.processes > 1 else ()

    def apply(self, ctx: Any, config: Any) -> None:
        size = ctx.world.processes
        ctx.effective[self.name] = ([("data", size)], None)
        if config is not None and config[0][0][1] != size:
            ctx.note(f"parallel_mode: data size {config[0][0][1]} adjusted to the world's {size} process(es)")
        if size > 1:
            ctx.request_ddp(find_unused_parameters=ctx.inputs.find_unused_parameters)
        else:
            ctx.note("parallel_mode: a world of one process, no DDP wrapper")


@register
class AutoDDP(Method):
    name, phase = "auto_ddp", Phase.DATA_PARALLEL
    summary = "DistributedDataParallel when more than one process trains; config: DDP keyword arguments"

    def validate(self, config: Any) -> Any:
        out = self.dict_config(config, dict.fromkeys(_DDP_KEYS))
        return out or None

    def candidates(self, model: torch.nn.Module, device: torch.device, world: Any) -> tuple[Any, ...]:
        return ()  # the search's DDP is parallel_mode's; auto_ddp's config (DDP's arguments) is the user's to give

    def apply(self, ctx: Any, config: Any) -> None:
        if ctx.world.processes > 1:
            ctx.request_ddp(**{"find_unused_parameters": ctx.inputs.find_unused_parameters, **(config or {})})
        else:
            ctx.note("auto_ddp: a world of one process, no DDP wrapper")


@register
class Zero1(Method):
    name, phase, group, distributed = "zero1", Phase.DATA_PARALLEL, "sharding", True
    summary = "ZeRO stage 1: optimizer state sharded over the processes (torch's ZeroRedundancyOptimizer) + DDP"

    def validate(self, config: Any) -> Any:
        out = self.dict_config(config, {"parameters_as_bucket_view": None, "use_ds_zero": None})
        if out.pop("use_ds_zero", False):
            raise self.config_error(config, "asks for DeepSpeed's ZeRO (use_ds_zero), which flextrain does not "
                                            "include: zero1 is torch's ZeroRedundancyOptimizer")
        return out or None

    def apply(self, ctx: Any, config: Any) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        ctx.request_ddp(find_unused_parameters=ctx.inputs.find_unused_parameters)
        inputs = ctx.inputs
        if inputs.optim_func is None:
            ctx.note("zero1: no optim_func, so no optimizer to shard (DDP only)")
            return

        def build(params: Any) -> torch.optim.Optimizer:
            return ZeroRedundancyOptimizer(params, optimizer_class=inputs.optim_func, **(config or {}),
                                           **(inputs.optim_args or {}))

        ctx.optimizer_builder = build


__all__ = ["AutoDDP", "ParallelMode", "Zero1"]
