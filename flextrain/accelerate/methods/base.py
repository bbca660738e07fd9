"""What an optimization method is: a name, a config it validates, a check of where it applies, an apply.

A strategy is a list of ``(name, config)`` steps; :func:`flextrain.accelerate.apply.apply_strategy`
applies them in :class:`Phase` order (not list order), each method's :meth:`Method.apply` changing
a :class:`flextrain.accelerate.context.Context` (the model, the optimizer to build, the loss and
input functions). Methods are registered by name (:mod:`flextrain.accelerate.methods.registry`);
the built-in ones live in the sibling modules and register themselves on import.

Contracts a method keeps:

- :meth:`Method.validate` turns every accepted spelling of a config into one canonical value
  (``("amp_native", "bf16")`` and ``{"dtype": torch.bfloat16}`` both become
  ``{"dtype": "bf16", "skip_if_nonfinite": False}``) and is idempotent, so strategies compare
  equal and round-trip through JSON. A bad config raises :class:`ConfigError` naming the method.
- :meth:`Method.check` says, without changing anything, why the method cannot apply to this
  model, device and world (a sentence), or None when it can.
- :meth:`Method.apply` changes only the context; global state it must touch (TF32 flags) is
  registered for :meth:`Context.restore` so that dry runs leave the process as they found it.
- :meth:`Method.loss_tolerance` (default :attr:`Method.loss_rtol`): how far the loss of a run with the method may drift from a plain
  fp32 run over a few steps (``compare`` rejects a strategy beyond the largest of its methods').
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from flextrain.accelerate.errors import ConfigError
from flextrain.elastic.world import World

if TYPE_CHECKING:
    from flextrain.accelerate.context import Context


class Phase(enum.IntEnum):
    """When a method applies, whatever its place in the strategy's list."""

    REPLACE = 0  # swap modules (module_replace): before anything holds the old ones
    CAST = 1  # dtypes, memory formats, backend flags (half, channels_last, tf32)
    CHECKPOINT = 2  # activation checkpointing of submodules, inside any wrapper
    SHARD = 3  # FSDP-family wrappers (fsdp, fsdp2, zero2)
    DATA_PARALLEL = 4  # DDP (parallel_mode, auto_ddp, zero1); wrapped once, after the phase
    AUTOCAST = 5  # amp_native: autocast around the outermost forward and the loss
    COMPILE = 6  # torch.compile of the finished model


class Method(ABC):
    """One optimization method. Subclasses set the class attributes and implement :meth:`apply`."""

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    phase: ClassVar[Phase]
    # At most one method of a group in a strategy (e.g. "precision": amp_native or half).
    group: ClassVar[str | None] = None
    # Needs a data-parallel world of more than one process (check() says so otherwise).
    distributed: ClassVar[bool] = False
    loss_rtol: ClassVar[float] = 1e-3
    # Steps a dry run makes before timing (compiled code is still settling in its first steps).
    warmup_steps: ClassVar[int] = 1
    summary: ClassVar[str] = ""

    # ---- config ------------------------------------------------------------------------
    def validate(self, config: Any) -> Any:
        """The canonical config (see the module docstring); None by default accepts only None."""
        if config is not None:
            raise self.config_error(config, "takes no config (give the name alone)")
        return None

    def config_error(self, config: Any, problem: str) -> ConfigError:
        return ConfigError(f"load_strategy: config of {self.name!r} {problem}; got {config!r}")

    def dict_config(self, config: Any, allowed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``config`` as a dict (None: empty) whose keys are all in ``allowed`` (None: any string)."""
        if config is None:
            return {}
        if not isinstance(config, Mapping):
            raise self.config_error(config, "must be a dict")
        out = dict(config)
        for key in out:
            if not isinstance(key, str):
                raise self.config_error(config, f"has a non-string key {key!r}")
            if allowed is not None and key not in allowed:
                raise self.config_error(config, f"has an unknown key {key!r} (known: {', '.join(sorted(allowed))})")
        return out

    # ---- where it applies ----------------------------------------------------------------
    def check(self, model: torch.nn.Module, device: torch.device, world: World, config: Any = None) -> str | None:
        """Why this method cannot apply here (a sentence), or None. The default checks
        :attr:`distributed` against the world."""
        if self.distributed and world.processes < 2:
            return f"needs a data-parallel world of more than one process (this one has {world.processes})"
        return None

    # ---- doing it --------------------------------------------------------------------------
    @abstractmethod
    def apply(self, ctx: Context, config: Any) -> None:
        """Change ``ctx`` (model, optimizer builder, loss and input functions) for ``config``."""

    def loss_tolerance(self, config: Any) -> float:
        """Relative loss drift from a plain run that ``compare`` accepts (default :attr:`loss_rtol`)."""
        return self.loss_rtol

    # ---- for searches --------------------------------------------------------------------
    def neighbours(self, config: Any) -> tuple[Any, ...]:
        """Configs "around" ``config`` worth a dry run when finetuning a loaded strategy."""
        return ()

    def candidates(self, model: torch.nn.Module, device: torch.device, world: World) -> tuple[Any, ...]:
        """Configs the automatic search may try on this model (none where check() refuses)."""
        if self.check(model, device, world) is not None:
            return ()
        try:
            return (self.validate(None),)
        except ConfigError:
            return ()  # a method that needs a config from the user (checkpoint) has no default

    def __repr__(self) -> str:
        return f"<method {self.name} ({self.phase.name.lower()})>"


# ---- shared config helpers -------------------------------------------------------------------

HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_SPELLINGS = {"fp16": "fp16", "float16": "fp16", "half": "fp16", torch.float16: "fp16",
                    "bf16": "bf16", "bfloat16": "bf16", torch.bfloat16: "bf16"}


def half_dtype_name(method: Method, value: Any, config: Any) -> str:
    """``"fp16"`` or ``"bf16"`` from any of their spellings (strings or torch dtypes)."""
    try:
        return _DTYPE_SPELLINGS[value]
    except (KeyError, TypeError):
        raise method.config_error(config, "needs dtype 'fp16' or 'bf16' (or torch.float16 / torch.bfloat16)") from None


def module_classes(method: Method, value: Any, config: Any, *, key: str) -> tuple[type | str, ...]:
    """A tuple of ``nn.Module`` subclasses or class names (strings) from one of them or a sequence."""
    items = value if isinstance(value, list | tuple | set | frozenset) else (value,)
    out: list[type | str] = []
    for item in items:
        if isinstance(item, str) and item:
            out.append(item)
        elif isinstance(item, type) and issubclass(item, torch.nn.Module):
            out.append(item)
        else:
            raise method.config_error(config, f"{key} must be module classes or class names, not {item!r}")
    if not out:
        raise method.config_error(config, f"{key} names no module class")
    return tuple(out)


def matches(module: torch.nn.Module, classes: tuple[type | str, ...]) -> bool:
    """``module`` is an instance of one of ``classes`` (a class name matches its own class's name)."""
    return any(isinstance(module, c) if isinstance(c, type) else type(module).__name__ == c for c in classes)


__all__ = ["HALF_DTYPES", "Method", "Phase", "half_dtype_name", "matches", "module_classes"]
