"""Apply a strategy: the one function that turns :class:`Inputs` and a :class:`Strategy` into the result.

:func:`apply_strategy` is what ``auto_accelerate``'s semi-automatic mode, every dry run and the
automatic search call. In order:

1. the world (:func:`current_world`) and the device (:func:`default_device`); the model (or a deep
   copy of it, ``copy_model=True``) moves to the device;
2. every method's ``check``: one that cannot apply raises :class:`UnavailableMethodError` (an
   explicit request in semi-automatic mode), or with ``skip_unavailable=True`` is left out and
   listed in the report's ``skipped``;
3. the methods' ``apply`` in :class:`Phase` order; after the DATA_PARALLEL phase the model is
   wrapped in ``DistributedDataParallel`` once if a method asked for it, more than one process
   trains, and no sharding method holds the model;
4. the optimizer, built on the final parameters (``optim_func(optim_param_func(model) or
   model.parameters(), **optim_args)``, or a method's builder), then wrapped by the methods
   (amp's scaler); the LR scheduler on the wrapped optimizer; the data loader over the world
   (:func:`flextrain.accelerate.data.build_dataloader`); the returned ``loss_func`` (checks for a
   scalar loss, plus the methods' wrappers) and ``prepare_input`` (the user's or
   :func:`~flextrain.accelerate.data.to_device`, then the methods' casts, then a structure check).
"""

from __future__ import annotations

import collections
import copy
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from flextrain.accelerate.context import Context, Inputs, Report, Skipped
from flextrain.accelerate.data import UnevenLoss, build_dataloader, check_input, loss_of, to_device
from flextrain.accelerate.errors import AccelerateError, UnavailableMethodError
from flextrain.accelerate.methods import Phase, get
from flextrain.accelerate.strategy import Strategy
from flextrain.elastic import progress
from flextrain.elastic.session import Session
from flextrain.elastic.world import World, WorldSource, torch_world

log = logging.getLogger(__name__)

class AutoAccelerateResult(collections.namedtuple(
        "AutoAccelerateResult", "model, optim, dataloader, loss_func, prepare_input")):
    """What auto_accelerate returns as ``result``: ATorch's namedtuple of five, so that
    ``model, optim, dataloader, loss_func, prepare_input = result`` works as there; ``lr_scheduler``
    and ``args`` (the :class:`flextrain.accelerate.context.Report`) are attributes beside them."""

    lr_scheduler: Any = None
    args: Any = None

    def __new__(cls, model, optim, dataloader, loss_func, prepare_input, lr_scheduler=None, args=None):
        self = super().__new__(cls, model, optim, dataloader, loss_func, prepare_input)
        self.lr_scheduler, self.args = lr_scheduler, args
        return self

    def _replace(self, **changes: Any) -> "AutoAccelerateResult":
        extra = {name: changes.pop(name, getattr(self, name)) for name in ("lr_scheduler", "args")}
        return type(self)(*super()._replace(**changes), **extra)


def current_world(*, init: bool = True) -> World:
    """The data-parallel world of processes (one device each). Launched by torchrun or ``flextrain run``
    (``WORLD_SIZE`` > 1) without a process group yet, ``init=True`` initialises the default group
    (nccl on CUDA, else gloo) from the environment, as data parallelism needs one."""
    world = torch_world()
    if init and world.source is WorldSource.ENVIRONMENT and world.processes > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        world = torch_world()
    return World(processes=world.processes, rank=world.rank, devices_per_process=1, source=world.source)


def default_device(device: Any = None) -> torch.device:
    """``device`` if given; else ``cuda:LOCAL_RANK`` (made current) where CUDA is available; else the CPU."""
    if device is not None:
        try:
            return torch.device(device)
        except (RuntimeError, TypeError):
            raise AccelerateError(f"device must be a torch device or its name, got {device!r}") from None
    if torch.cuda.is_available():
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


@dataclass(frozen=True)
class Applied:
    """The result of :func:`apply_strategy`: ATorch's namedtuple, the report, the data plan (None
    without a dataset) and :meth:`restore` (undo global flags, e.g. TF32, after a dry run)."""

    result: AutoAccelerateResult
    report: Report
    session: Session | None
    _context: Context

    def restore(self) -> None:
        self._context.restore()

    @property
    def core(self) -> torch.nn.Module:
        """The user's module as the strategy left it (casts, patched forwards, replaced modules), inside
        any wrapper (``torch.compile``, DDP, FSDP): its ``state_dict`` keys are the plain model's. What
        flextrain jobs checkpoint and broadcast (flextrain/worker/accelerating.py)."""
        return self._context.core


def _optimizer(ctx: Context) -> torch.optim.Optimizer | None:
    inputs = ctx.inputs
    if inputs.optim_func is None:
        if ctx.optimizer_wrappers:
            ctx.note("no optim_func: methods that wrap the optimizer had nothing to wrap")
        return None
    params = inputs.optim_param_func(ctx.core) if inputs.optim_param_func is not None else ctx.core.parameters()
    params = list(params)
    build = ctx.optimizer_builder or (lambda p: inputs.optim_func(p, **(inputs.optim_args or {})))
    try:
        optimizer = build(params)
    except TypeError as e:
        raise AccelerateError(f"optim_func(parameters, **optim_args) failed: {e}") from e
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise AccelerateError(f"optim_func must make a torch.optim.Optimizer, it returned {type(optimizer).__name__}")
    for wrap in ctx.optimizer_wrappers:
        optimizer = wrap(optimizer)
    return optimizer


def _report_steps(optimizer: Any, *, samples: int) -> None:
    """Report each step of ``optimizer`` (with the losses the loss function gave since the previous one and
    this process's ``samples``) to flextrain.elastic.progress."""
    steps = itertools.count(1)
    if hasattr(optimizer, "register_step_post_hook"):  # a torch optimizer
        optimizer.register_step_post_hook(
            lambda opt, args, kwargs: progress.report(step=progress.restored_step() + next(steps), samples=samples))
        return
    inner = optimizer.step  # a method's wrapper optimizer: its own step

    def step(*args: Any, **kwargs: Any) -> Any:
        result = inner(*args, **kwargs)
        progress.report(step=progress.restored_step() + next(steps), samples=samples)
        return result

    optimizer.step = step


class _CheckedLoss:
    """The user's loss_func, checked to return a scalar loss (or a tuple starting with one)."""

    def __init__(self, loss_func: Callable[..., Any]) -> None:
        self.loss_func = loss_func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.loss_func(*args, **kwargs)
        progress.note_loss(loss_of(result))  # the job's history (a no-op outside a script job)
        return result


class _PrepareInput:
    """The user's prepare_input (or to_device), then the methods' casts, then the structure check."""

    def __init__(self, prepare: Callable[[Any, Any], Any], casts: list[Callable[[Any], Any]], fmt: str | None,
                 device: torch.device) -> None:
        self.prepare, self.casts, self.fmt, self.device = prepare, list(casts), fmt, device

    def __call__(self, data: Any, device: Any = None) -> Any:
        data = self.prepare(data, self.device if device is None else device)
        for cast in self.casts:
            data = cast(data)
        return check_input(data, self.fmt)


def check_strategy(strategy: Strategy, model: torch.nn.Module, device: torch.device, world: World, *,
                   skip_unavailable: bool = False) -> tuple[list[Any], list[Skipped]]:
    """The steps that can apply here and the ones skipped (with reasons); with ``skip_unavailable``
    False, the first that cannot apply raises :class:`UnavailableMethodError`."""
    steps, skipped = [], []
    for step in strategy:
        reason = get(step.name).check(model, device, world, step.config)
        if reason is None:
            steps.append(step)
        elif skip_unavailable:
            skipped.append(Skipped(step.name, reason))
        else:
            raise UnavailableMethodError(step.name, reason)
    return steps, skipped


def apply_strategy(strategy: Any, inputs: Inputs, *, device: Any = None, world: World | None = None,
                   skip_unavailable: bool = False, copy_model: bool = False, dataloader: bool = True) -> Applied:
    """Apply ``strategy`` (anything :meth:`Strategy.load` takes) to ``inputs`` (module docstring).
    ``copy_model`` leaves ``inputs.model`` untouched (dry runs); ``dataloader=False`` builds no loader."""
    strategy = Strategy.load(strategy)
    device = default_device(device)
    world = current_world() if world is None else world
    model = copy.deepcopy(inputs.model) if copy_model else inputs.model
    model.to(device)
    steps, skipped = check_strategy(strategy, model, device, world, skip_unavailable=skip_unavailable)
    applied = Strategy(steps)
    ctx = Context(inputs=inputs, model=model, device=device, world=world, strategy=applied)
    for phase in Phase:
        for step in steps:
            method = get(step.name)
            if method.phase is phase:
                method.apply(ctx, step.config)
        if phase is Phase.DATA_PARALLEL and ctx.ddp_kwargs is not None and ctx.multi_process:
            if ctx.sharded_by is not None:
                ctx.note(f"data parallel by {ctx.sharded_by}: no DDP wrapper")
            else:
                ids = [device.index] if device.type == "cuda" else None
                ctx.model = torch.nn.parallel.DistributedDataParallel(ctx.model, device_ids=ids, **ctx.ddp_kwargs)
    optimizer = _optimizer(ctx)
    scheduler = None
    if inputs.lr_scheduler_cls is not None:
        scheduler = inputs.lr_scheduler_cls(optimizer, **(inputs.lr_scheduler_args or {}))
    loader, session = None, None
    if dataloader and inputs.dataset is not None:
        loader, session = build_dataloader(inputs.dataset, inputs.dataloader_args, world,
                                           distributed_sampler_cls=inputs.distributed_sampler_cls,
                                           seed=inputs.sampler_seed)
    loss_func = None
    if inputs.loss_func is not None:
        loss_func = _CheckedLoss(inputs.loss_func)
        if session is not None and not session.even and world.processes > 1:
            loss_func = UnevenLoss(loss_func, world.processes)
            ctx.note("uneven global batch: each process's gradient weighted by its share of the samples")
        for wrap in ctx.loss_wrappers:
            loss_func = wrap(loss_func)
    if progress.active():  # inside a script job: each optimizer step goes into the job's history
        _report_steps(optimizer, samples=session.batch_size if session is not None else
                      int((inputs.dataloader_args or {}).get("batch_size") or 0))
    prepare = _PrepareInput(inputs.prepare_input or to_device, ctx.input_casts, inputs.model_input_format, device)
    effective = Strategy([(s.name, ctx.effective.get(s.name, s.config)) for s in steps])
    report = Report(strategy=effective, skipped=tuple(skipped), notes=tuple(ctx.notes), device=str(device),
                    world_size=world.processes, rank=world.rank,
                    data_plan=session.describe() if session is not None else None)
    result = AutoAccelerateResult(ctx.model, optimizer, loader, loss_func, prepare, scheduler, report)
    return Applied(result, report, session, ctx)


__all__ = ["Applied", "AutoAccelerateResult", "apply_strategy", "check_strategy", "current_world", "default_device"]
