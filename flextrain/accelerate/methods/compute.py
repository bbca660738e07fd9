"""Compute and activation memory: ``checkpoint``, ``native_dynamo`` (alias ``compile``), ``channels_last``.

- ``checkpoint``: activation checkpointing of the modules of given classes: config a tuple of
  module classes or class names, or ``{"wrap_class": ..., "no_reentrant": bool,
  "max_checkpoint_module_num": n}`` (no_reentrant by default, as ATorch). A checkpointed module's
  forward runs again in the backward pass instead of keeping its activations. Modules inside
  another checkpointed module are not checkpointed again.
- ``native_dynamo`` / ``compile``: ``torch.compile`` of the finished model; config None or
  ``{"backend", "mode", "fullgraph", "dynamic"}`` (ATorch's ``dynamo_backend`` names the backend).
  Inductor on the CPU needs a C++ compiler (``check`` says when there is none).
- ``channels_last`` (flextrain's own): a convolutional net's 4-D weights, and every 4-D
  floating-point tensor of a prepared batch, in ``torch.channels_last`` memory format.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from flextrain.accelerate.methods.base import Method, Phase, matches, module_classes
from flextrain.accelerate.methods.registry import register
from flextrain.accelerate.patches import CheckpointForward
from flextrain.accelerate.data import map_tensors


def _checkpointed(model: torch.nn.Module, classes: tuple[Any, ...], limit: int | None) -> list[torch.nn.Module]:
    """The modules to checkpoint: matches not inside another match, in module order, at most ``limit``."""
    chosen: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside or not matches(module, classes):
            continue
        chosen.append(module)
        inside.update(id(m) for m in module.modules())
        if limit is not None and len(chosen) == limit:
            break
    return chosen


_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def repeated_block(model: torch.nn.Module) -> type | None:
    """The class of the model's repeated blocks (a transformer's layers): of the classes with two or
    more instances that have submodules and parameters (containers and the model itself aside), the
    one whose instances hold the most parameters; None when there is none."""
    held: dict[type, list[int]] = {}
    for module in model.modules():
        if module is model or isinstance(module, _CONTAINERS) or not any(True for _ in module.children()):
            continue
        numel = sum(p.numel() for p in module.parameters())
        if numel:
            held.setdefault(type(module), []).append(numel)
    repeated = [(sum(sizes), cls.__qualname__, cls) for cls, sizes in held.items() if len(sizes) >= 2]
    return max(repeated, key=lambda r: r[:2])[2] if repeated else None


@register
class Checkpoint(Method):
    name, phase = "checkpoint", Phase.CHECKPOINT
    loss_rtol = 1e-4
    summary = "activation checkpointing of the given module classes (recomputed in backward)"

    def validate(self, config: Any) -> Any:
        if config is None:
            raise self.config_error(config, "needs the module classes to checkpoint, e.g. (Block,) or "
                                            '{"wrap_class": (Block,), "no_reentrant": True}')
        if isinstance(config, dict):
            cfg = self.dict_config(config, {"wrap_class": None, "no_reentrant": None, "max_checkpoint_module_num": None})
            if "wrap_class" not in cfg:
                raise self.config_error(config, "needs wrap_class")
        else:
            cfg = {"wrap_class": config}
        out = {"wrap_class": module_classes(self, cfg["wrap_class"], config, key="wrap_class"),
               "no_reentrant": cfg.get("no_reentrant", True)}
        if not isinstance(out["no_reentrant"], bool):
            raise self.config_error(config, "no_reentrant must be True or False")
        limit = cfg.get("max_checkpoint_module_num")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise self.config_error(config, "max_checkpoint_module_num must be a positive integer")
            out["max_checkpoint_module_num"] = limit
        return out

    def check(self, model: torch.nn.Module, device: torch.device, world: Any, config: Any = None) -> str | None:
        if config is not None and not _checkpointed(model, config["wrap_class"], 1):
            names = ", ".join(c if isinstance(c, str) else c.__name__ for c in config["wrap_class"])
            return f"the model has no module of class {names} to checkpoint"
        return None

    def neighbours(self, config: Any) -> tuple[Any, ...]:
        return ({**config, "no_reentrant": not config["no_reentrant"]},)

    def candidates(self, model: torch.nn.Module, device: torch.device, world: Any) -> tuple[Any, ...]:
        block = repeated_block(model)
        return () if block is None else (self.validate((block,)),)

    def apply(self, ctx: Any, config: Any) -> None:
        chosen = _checkpointed(ctx.model, config["wrap_class"], config.get("max_checkpoint_module_num"))
        for module in chosen:
            CheckpointForward.install(module, use_reentrant=not config["no_reentrant"])
        ctx.note(f"checkpoint: {len(chosen)} module(s) recompute their forward in the backward pass")


def _cxx_compiler() -> str | None:
    for name in filter(None, (os.environ.get("CXX"), "c++", "g++", "clang++")):
        found = shutil.which(name)
        if found:
            return found
    return None


@register
class NativeDynamo(Method):
    name, aliases, phase = "native_dynamo", ("compile",), Phase.COMPILE
    warmup_steps = 3  # on the CPU, steps 2 and 3 still run ~100x slower than later ones (measured)
    summary = "torch.compile of the whole model (config: backend, mode, fullgraph, dynamic)"

    def validate(self, config: Any) -> Any:
        cfg = self.dict_config(config, {"backend": None, "mode": None, "fullgraph": None, "dynamic": None,
                                        "dynamo_backend": None})
        if "dynamo_backend" in cfg:  # ATorch's key, an upper-case backend name
            backend = cfg.pop("dynamo_backend")
            cfg.setdefault("backend", backend.value if hasattr(backend, "value") else backend)
        if "backend" in cfg:
            if not isinstance(cfg["backend"], str) or not cfg["backend"]:
                raise self.config_error(config, "backend must be a backend name such as 'inductor'")
            cfg["backend"] = cfg["backend"].lower()
        if cfg.get("mode") is not None and cfg["mode"] not in ("default", "reduce-overhead", "max-autotune",
                                                               "max-autotune-no-cudagraphs"):
            raise self.config_error(config, "mode must be default, reduce-overhead, max-autotune or "
                                            "max-autotune-no-cudagraphs")
        if "fullgraph" in cfg and not isinstance(cfg["fullgraph"], bool):
            raise self.config_error(config, "fullgraph must be True or False")
        if cfg.get("dynamic") is not None and not isinstance(cfg["dynamic"], bool):
            raise self.config_error(config, "dynamic must be True, False or None")
        return cfg or None

    def check(self, model: torch.nn.Module, device: torch.device, world: Any, config: Any = None) -> str | None:
        if not hasattr(torch, "compile"):
            return "this torch has no torch.compile"
        backend = (config or {}).get("backend", "inductor")
        if backend == "inductor" and device.type == "cpu" and _cxx_compiler() is None:
            return "inductor compiles C++ for the CPU and no C++ compiler (c++, g++, clang++, $CXX) is installed"
        return None

    def apply(self, ctx: Any, config: Any) -> None:
        ctx.model = torch.compile(ctx.model, **(config or {}))


@register
class ChannelsLast(Method):
    name, phase = "channels_last", Phase.CAST
    summary = "channels_last memory format for a conv net's 4-D weights and inputs"

    def check(self, model: torch.nn.Module, device: torch.device, world: Any, config: Any = None) -> str | None:
        if not any(isinstance(m, torch.nn.Conv2d) for m in model.modules()):
            return "the model has no 2-D convolution, so the memory format changes nothing"
        return None

    def apply(self, ctx: Any, config: Any) -> None:
        ctx.model.to(memory_format=torch.channels_last)

        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t

        ctx.input_casts.append(lambda data: map_tensors(data, cast))


__all__ = ["ChannelsLast", "Checkpoint", "NativeDynamo"]
