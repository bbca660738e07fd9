"""What a strategy is applied to (:class:`Inputs`), the state methods change while it is applied
(:class:`Context`), and what came of it (:class:`Report`).

:class:`Inputs` holds ``auto_accelerate``'s arguments, checked once (:meth:`Inputs.checked` raises
:class:`AccelerateError` naming a bad one). It never changes: every dry run and the final apply
start from it (dry runs from a deep copy of its model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from flextrain.accelerate.data import MODEL_INPUT_FORMATS
from flextrain.accelerate.errors import AccelerateError
from flextrain.accelerate.strategy import Strategy
from flextrain.elastic.world import World


def _callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise AccelerateError(f"{name} must be callable, got {type(value).__name__}")
    return value


def _mapping(name: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise AccelerateError(f"{name} must be a dict of keyword arguments, got {value!r}")
    return dict(value)


@dataclass(frozen=True)
class Inputs:
    """``auto_accelerate``'s arguments (see its docstring for each one's meaning)."""

    model: torch.nn.Module
    optim_func: Callable[..., torch.optim.Optimizer] | None = None
    dataset: Any = None
    loss_func: Callable[..., Any] | None = None
    prepare_input: Callable[[Any, Any], Any] | None = None
    model_input_format: str | None = None
    optim_args: dict[str, Any] | None = None
    optim_param_func: Callable[[torch.nn.Module], Any] | None = None
    dataloader_args: dict[str, Any] | None = None
    distributed_sampler_cls: Any = None
    lr_scheduler_cls: Any = None
    lr_scheduler_args: dict[str, Any] | None = None
    find_unused_parameters: bool = False
    sample_batch: Any = None  # one batch for dry runs when there is no dataset (ATorch's kwarg)
    sampler_seed: int = 0

    @classmethod
    def checked(cls, model: Any, **kwargs: Any) -> Inputs:
        """Inputs whose every argument has the right kind; AccelerateError naming the first that has not."""
        if not isinstance(model, torch.nn.Module):
            raise AccelerateError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        for name in ("optim_func", "loss_func", "prepare_input", "optim_param_func", "lr_scheduler_cls",
                     "distributed_sampler_cls"):
            _callable(name, kwargs.get(name))
        for name in ("optim_args", "dataloader_args", "lr_scheduler_args"):
            kwargs[name] = _mapping(name, kwargs.get(name))
        fmt = kwargs.get("model_input_format")
        if fmt not in MODEL_INPUT_FORMATS:
            raise AccelerateError(f"model_input_format must be None, 'unpack_sequence' or 'unpack_dict', got {fmt!r}")
        dataset = kwargs.get("dataset")
        if dataset is not None and not (hasattr(dataset, "__getitem__") or hasattr(dataset, "__iter__")):
            raise AccelerateError(f"dataset must be a torch Dataset (indexable or iterable), got {type(dataset).__name__}")
        if kwargs.get("lr_scheduler_cls") is not None and kwargs.get("optim_func") is None:
            raise AccelerateError("lr_scheduler_cls needs optim_func: a scheduler schedules the optimizer it builds")
        if kwargs.get("dataloader_args") is not None and dataset is None:
            raise AccelerateError("dataloader_args needs dataset: they describe the loader built over it")
        fup = kwargs.get("find_unused_parameters", False)
        if not isinstance(fup, bool):
            raise AccelerateError(f"find_unused_parameters must be True or False, got {fup!r}")
        seed = kwargs.get("sampler_seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise AccelerateError(f"sampler_seed must be an integer, got {seed!r}")
        return cls(model=model, **kwargs)

    def replace(self, **changes: Any) -> Inputs:
        return dataclasses.replace(self, **changes)


class Skipped(NamedTuple):
    """A method of the strategy that was not applied, and why."""

    name: str
    reason: str


@dataclass(eq=False)
class Context:
    """The state methods change while a strategy is applied (by
    :func:`flextrain.accelerate.apply.apply_strategy`).

    ``model`` is the outermost module (what the user calls); ``core`` the module whose parameters
    the optimizer takes and ``optim_param_func`` is called with (the user's own module; FSDP's
    wrapper where FSDP owns the parameters). ``input_casts`` run, in order, on every prepared
    batch; ``optimizer_builder`` (default: ``optim_func(params, **optim_args)``) makes the
    optimizer from the parameters and ``optimizer_wrappers`` wrap it in order. Methods add
    ``notes`` for the report and register global changes to undo with :meth:`on_restore`.
    """

    inputs: Inputs
    model: torch.nn.Module
    device: torch.device
    world: World
    strategy: Strategy
    core: torch.nn.Module | None = None
    loss_func: Callable[..., Any] | None = None
    loss_wrappers: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = field(default_factory=list)
    input_casts: list[Callable[[Any], Any]] = field(default_factory=list)
    optimizer_builder: Callable[[Any], torch.optim.Optimizer] | None = None
    optimizer_wrappers: list[Callable[[torch.optim.Optimizer], torch.optim.Optimizer]] = field(default_factory=list)
    ddp_kwargs: dict[str, Any] | None = None  # DDP asked for (parallel_mode, auto_ddp, zero1)
    sharded_by: str | None = None  # the method whose wrapper shards the parameters
    effective: dict[str, Any] = field(default_factory=dict)  # name -> config as applied, when it differs
    notes: list[str] = field(default_factory=list)
    _restores: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.core is None:
            self.core = self.model

    @property
    def multi_process(self) -> bool:
        return self.world.processes > 1

    def note(self, message: str) -> None:
        self.notes.append(message)

    def request_ddp(self, **kwargs: Any) -> None:
        """Ask for DDP over the world (merged with earlier asks); applied once after the DATA_PARALLEL
        phase, and only when more than one process trains and no sharding wrapper holds the model."""
        self.ddp_kwargs = {**(self.ddp_kwargs or {}), **kwargs}

    def on_restore(self, fn: Callable[[], None]) -> None:
        self._restores.append(fn)

    def restore(self) -> None:
        """Undo the global changes methods made (dry runs call this; the final apply keeps them)."""
        while self._restores:
            self._restores.pop()()


@dataclass(frozen=True)
class Report:
    """What applying a strategy did: the methods applied (with the configs as applied), the ones
    skipped and why, notes, the world and the data plan, and the dry runs behind the choice."""

    strategy: Strategy
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[str, ...] = ()
    device: str = "cpu"
    world_size: int = 1
    rank: int = 0
    data_plan: str | None = None
    dry_run: Any = None  # flextrain.accelerate.dryrun.DryRunResult of the chosen strategy, if one ran
    tried: tuple[Any, ...] = ()  # finetune and search: every DryRunResult
    search: Any = None  # fully automatic mode: flextrain.accelerate.results.SearchResult (every candidate)

    def replace(self, **changes: Any) -> Report:
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        lines = [f"auto_accelerate on {self.device}, {self.world_size} process(es): "
                 f"{', '.join(self.strategy.names) or 'no methods'}"]
        lines += [f"  skipped {s.name}: {s.reason}" for s in self.skipped]
        lines += [f"  {n}" for n in self.notes]
        if self.data_plan:
            lines.append(f"  data: {self.data_plan}")
        if self.search is not None:
            lines += [f"  {line}" for line in self.search.table().splitlines()]
        else:
            lines += [f"  tried {r.describe()}" for r in self.tried]
        if self.dry_run is not None and not self.tried:
            lines.append(f"  dry run: {self.dry_run.describe()}")
        return "\n".join(lines)


__all__ = ["Context", "Inputs", "Report", "Skipped"]
