"""Elastic PyTorch scripts: ``init(G, M)`` plans the step for the world, ``Optimizer`` accumulates.

A script asks for a global batch ``G`` per optimizer step and says that one
device holds at most ``M`` samples; :func:`init` finds the data-parallel world
(:func:`flextrain.elastic.world.torch_world`: the process group, else
``WORLD_SIZE``/``RANK``, else the local devices) and plans the step exactly as
a flextrain job would (:class:`flextrain.elastic.session.Session`)::

    import flextrain.elastic.torch as elastic

    elastic.init(256, 64)                  # or init(256, max_micro_batch=64)
    loader = DataLoader(data, batch_size=elastic.batch_size, ...)
    optimizer = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in loader:
        with optimizer.sync_context(model):   # DDP: no all-reduce before the last micro-step
            loss_fn(model(x), y).backward()   # the loss is the mean over the micro-batch
        optimizer.step()                      # the real step runs every `steps` calls
        optimizer.zero_grad()                 # a no-op until the real step ran
        if optimizer.stepped:
            scheduler.step()                  # once per real update

Module attributes (None until :func:`init` ran; every call of :func:`init`
recomputes them, so a script calls it again after its world changed):
``steps``, ``batch_size``, ``batch_sizes``, ``device_batch_size``,
``global_batch_size``, ``gpus`` (== ``world_size``), ``rank``, ``master``,
``loss_weights`` and ``session`` (the :class:`Session` itself).

Batch-size traces (a global batch per optimizer step, changing during training) use
:class:`TraceBatchSampler` (:mod:`flextrain.elastic.trace_sampler`) with a rule optimizer,
:class:`LinearRuleOptimizer`, :class:`SqrtRuleOptimizer` or :class:`AdaScaleOptimizer`
(:mod:`flextrain.elastic.rules`), instead of ``init`` and :class:`Optimizer`;
:class:`AdaptiveBatchSampler` (:mod:`flextrain.elastic.adaptive`) chooses the trace online
from the gradient noise scale that :class:`AdaScaleOptimizer` measures.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from flextrain.elastic.adaptive import AdaptiveBatchSampler
from flextrain.elastic.infinity import InfinityBatch
from flextrain.elastic.memory import MemoryMonitor
from flextrain.elastic.model_summary import summary
from flextrain.elastic.progress import note_loss, report, report_loss, restored_step
from flextrain.elastic.rules import AdaScaleOptimizer, LinearRuleOptimizer, RootRuleOptimizer, SqrtRuleOptimizer
from flextrain.elastic.session import (ElasticInitError, Session, activate, environment_processes, max_micro_batch_of,
                                       require_process_group)
from flextrain.elastic.state import State
from flextrain.elastic.trace_sampler import TraceBatchSampler
from flextrain.elastic.world import torch_world
from flextrain.elastic.wrapping import WrappedOptimizer

log = logging.getLogger(__name__)

# Set by init() (names: flextrain.elastic.session.ATTRIBUTES); None before it ran.
steps: int | None = None
batch_size: int | None = None
batch_sizes: tuple[int, ...] | None = None
device_batch_size: int | None = None
global_batch_size: int | None = None
gpus: int | None = None
world_size: int | None = None
rank: int | None = None
master: bool | None = None
loss_weights: tuple[float, ...] | None = None
session: Session | None = None


def init(global_batch_size: int, max_gpu_batch_size: int | str | None = None, *,
         max_micro_batch: int | str | None = None, model: Any = None, loss_fn: Any = None, sample: Any = None,
         optimizer: Any = None, memory_limit: int | str | None = None, cache: Any = None) -> Session:
    """Plan one optimizer step of ``global_batch_size`` samples for this process's world.

    ``max_gpu_batch_size`` (AIkit's positional name) and ``max_micro_batch`` are one
    setting, the most samples one device holds: give exactly one. ``"auto"`` probes it
    (:mod:`flextrain.elastic.autosize`: needs ``model``, ``loss_fn`` and one real ``sample``
    batch; ``optimizer``, ``memory_limit`` and ``cache`` are optional). Sets this module's
    attributes, makes the plan current (:func:`flextrain.elastic.session.activate`), logs
    :meth:`Session.describe` on rank 0 and returns the Session. Raises
    :class:`ElasticInitError` naming a bad argument.
    """
    limit = max_micro_batch_of(max_gpu_batch_size, max_micro_batch)
    if limit == "auto":
        from flextrain.elastic.autosize import probe_for_init

        limit = probe_for_init(global_batch_size, model=model, loss_fn=loss_fn, sample=sample, optimizer=optimizer,
                               memory_limit=memory_limit, cache=cache)
    planned = Session.plan_for(global_batch_size, limit, torch_world())
    globals().update(planned.attributes())
    activate(planned)
    if planned.master:
        log.info("flextrain.elastic.torch: %s", planned.describe())
    return planned


@dataclass(frozen=True)
class _Cycle:
    """One optimizer step's accumulation: how many micro-steps and each one's gradient factor."""

    steps: int
    weights: tuple[float, ...]  # factor of micro-step j's gradient (loss_weights; 1.0 for "sum")
    # The last micro-step's factor is applied by gradient hooks, before DDP's all-reduce: needed
    # when processes' final weights differ (uneven splits over several processes).
    hooked: bool


def _steps_arg(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ElasticInitError(f"steps must be a positive integer, got {value!r}")
    return value


def _disagreement(given: int, planned: Session) -> ElasticInitError:
    w = planned.world
    return ElasticInitError(
        f"steps={given} disagrees with init's plan for this world: steps={planned.steps} (global batch "
        f"{planned.global_batch_size}, max micro-batch {planned.max_micro_batch}, {w.size} replica(s)); "
        "pass steps=None (or flextrain.elastic.torch.steps) to follow init's plan")


class Optimizer(WrappedOptimizer):
    """Gradient accumulation over ``steps`` micro-steps, wrapping ``optimizer`` in place.

    The script calls ``loss.backward(); optimizer.step(); optimizer.zero_grad()`` for every
    micro-batch. ``step()`` runs the inner optimizer's step on every ``steps``-th call only
    (:attr:`stepped` says whether the last call did); ``zero_grad()`` zeroes only at the start of
    an accumulation (after the real step, or before the first micro-step), a no-op in between.

    The inner optimizer is not rebuilt: :attr:`param_groups`, :attr:`state` and :attr:`defaults`
    *are* its own, so Adam's moments, LR schedulers and hooks attached to it keep working, and
    other attributes pass through to it. ``steps=None`` follows :func:`init`'s plan, re-read at
    the start of every accumulation (a re-``init`` after a world change takes effect at the next
    real step). Given ``steps`` must agree with that plan when :func:`init` ran (else
    :class:`ElasticInitError` naming both values); without :func:`init`, it is used as is.

    ``reduction="mean"`` (the default; the loss of each micro-step is the mean over its
    micro-batch) applies the gradient of the mean over the global batch: micro-step ``j``'s
    gradient is weighted by ``session.loss_weights[j]`` (``1/steps`` for even splits), exact for
    uneven ones. ``reduction="sum"`` applies the plain sum of the micro-steps' gradients, as
    AIkit's / runai's PyTorch GA optimizer did.

    How the weights are applied, cheaply: between micro-steps ``.grad`` is kept in units of the
    next micro-step's weight (``step()`` rescales it by ``w[j]/w[j+1]``, which is 1, skipped,
    except at most once per step where an uneven split changes size), and the real step
    multiplies it by the last weight: one ``foreach`` multiply per real step. Under DDP with
    several processes and an uneven split the processes' last weights differ, so before the
    last micro-step ``.grad`` is brought to true units and that micro-step's gradient is
    scaled by parameter hooks before DDP all-reduces it. A script that calls
    ``optimizer.scale(loss).backward()`` (opt-in, as with ``GradScaler.scale``) has the weight
    applied to the scalar loss instead, and no pass over the gradients is made at all.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, steps: int | None = None, *,
                 reduction: str = "mean") -> None:
        super().__init__(optimizer)
        if reduction not in ("mean", "sum"):
            raise ValueError(f'reduction must be "mean" or "sum", got {reduction!r}')
        self.reduction = reduction
        self._steps_given = None if steps is None else _steps_arg(steps)
        self._follows_init = steps is None  # once a given `steps` agreed with init's plan
        self._cycle: _Cycle | None = None
        self._position = 0  # step() calls made in the current accumulation
        self._stepped = False
        self._real_steps = 0
        self._steps_loaded = False  # real_steps came from a state dict: the job's count already
        self._hooks: list[Any] = []
        # This accumulation's mode: None until its first micro-step, True when the script weights
        # its losses through scale(), False when the gradients are weighted; _scaled_at is the
        # micro-step scale() last ran in (it must run in every one of a loss-weighted accumulation).
        self._loss_weighted: bool | None = None
        self._scaled_at = -1
        if session is not None and not self._follows_init:
            if self._steps_given != session.steps:
                raise _disagreement(self._steps_given, session)
            self._follows_init = True
        if reduction == "mean" and _maybe_several_processes():
            self._register_hooks()  # before the first backward: its gradient may need the hook


    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)
        if self._hooks:
            self._register_hooks()

    def __repr__(self) -> str:
        return f"flextrain.elastic.torch.Optimizer(steps={self.steps}, reduction={self.reduction!r}, {self.optimizer!r})"

    # ---- accumulation ----------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Micro-steps in the current (or next) accumulation."""
        return self._current_cycle().steps

    @property
    def is_boundary(self) -> bool:
        """The next ``step()`` call runs the real step. Read it before the micro-step's backward
        (:meth:`sync_context` does) to skip DDP's all-reduce on the other micro-steps."""
        return self._position == self._current_cycle().steps - 1

    @property
    def stepped(self) -> bool:
        """The last ``step()`` call ran the inner optimizer's step: step LR schedulers then."""
        return self._stepped

    @property
    def real_steps(self) -> int:
        """Real optimizer steps taken through this wrapper."""
        return self._real_steps

    def sync_context(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """``model.no_sync()`` on micro-steps before the last one, a null context on the last one
        (see :func:`no_sync`)."""
        return no_sync(model, self)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times this micro-step's weight, to call ``.backward()`` on: opt-in, for scripts
        that want no pass over the gradients (the weight lands on a scalar). Once used, it must be
        used in every micro-step of the accumulation, before that micro-step's ``step()``; mixing
        it with plain ``loss.backward()`` in one accumulation is refused (the weights would be
        applied twice or not at all)."""
        cycle, j = self._current_cycle(), self._position
        if self._loss_weighted is False:
            raise RuntimeError(f"optimizer.scale(loss) in micro-step {j + 1} of {cycle.steps}, but the earlier "
                               "micro-steps of this accumulation called backward() on the plain loss: use "
                               "scale() in every micro-step or in none")
        self._loss_weighted, self._scaled_at = True, j
        note_loss(loss)  # the job's history (flextrain.elastic.progress; a no-op outside a script job)
        return loss * cycle.weights[j]

    def step(self, closure: Any = None) -> Any:
        """Count a micro-step; on the ``steps``-th, apply the weights and run the inner step.

        Returns the inner step's return value on a real step, else None.
        """
        if closure is not None:
            raise ValueError("flextrain.elastic.torch.Optimizer.step takes no closure: each micro-step's "
                             "backward runs in the script, before step()")
        cycle = self._current_cycle()
        j = self._position
        self._stepped = False
        if self._loss_weighted:
            if self._scaled_at != j:
                raise RuntimeError(f"micro-step {j + 1} of {cycle.steps} did not call optimizer.scale(loss), but "
                                   "earlier micro-steps of this accumulation did: use scale() in every micro-step "
                                   "or in none")
            return self._count(cycle, j, weigh=False)
        self._loss_weighted = False
        return self._count(cycle, j, weigh=True)

    def _count(self, cycle: _Cycle, j: int, *, weigh: bool) -> Any:
        if j < cycle.steps - 1:
            self._position = j + 1
            if cycle.hooked and j + 1 == cycle.steps - 1:
                factor = cycle.weights[j]  # to true units: the hooks weight the last micro-step
            else:
                factor = cycle.weights[j] / cycle.weights[j + 1]
            if weigh:
                self._scale_grads(factor)
            return None
        if weigh:
            self._scale_grads(1.0 if cycle.hooked else cycle.weights[j])
        # several processes with no group to sum over: each would apply its share alone (ElasticInitError)
        require_process_group(session.world.processes if session is not None else environment_processes())
        result = self.optimizer.step()
        self._cycle, self._position, self._stepped = None, 0, True
        self._loss_weighted, self._scaled_at = None, -1
        self._real_steps += 1
        # The job's history: this real step, its losses (report_loss / scale) and this process's samples.
        # every micro-batch of the step (this process's share of G), not the loader's one batch
        # (after a restore, continued from the step committed with the State, unless loaded with this wrapper)
        step = self._real_steps + (0 if self._steps_loaded else restored_step())
        report(step=step, samples=sum(session.batch_sizes) if session is not None else 0)
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients at the start of an accumulation only; between micro-steps, nothing."""
        if self._position == 0:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def _current_cycle(self) -> _Cycle:
        if self._cycle is None:
            self._cycle = self._plan_cycle()
            if self._cycle.hooked and not self._hooks:
                # Only if the world became multi-process after wrapping (see __init__): in time for
                # the last micro-step when steps > 1.
                self._register_hooks()
        return self._cycle

    def _plan_cycle(self) -> _Cycle:
        planned = session
        if planned is not None and not self._follows_init:
            if self._steps_given != planned.steps:
                raise _disagreement(self._steps_given, planned)
            self._follows_init = True
        if planned is None:
            if self._steps_given is None:
                raise ElasticInitError("Optimizer(optimizer) without steps follows init's plan: call "
                                       "flextrain.elastic.torch.init(global_batch_size, max_micro_batch) first, "
                                       "or pass steps=")
            k = self._steps_given
            weights, hooked = (1.0 / k,) * k, False
        else:
            k, weights = planned.steps, planned.loss_weights
            hooked = planned.world.processes > 1 and not planned.even
        if self.reduction == "sum":
            return _Cycle(k, (1.0,) * k, False)
        return _Cycle(k, tuple(weights), hooked)

    def _params(self) -> Iterator[torch.Tensor]:
        for group in self.optimizer.param_groups:
            yield from group["params"]

    def _scale_grads(self, factor: float) -> None:
        if factor == 1.0:
            return
        grads = [p.grad for p in self._params() if p.grad is not None]
        dense = [g for g in grads if not g.is_sparse]
        if dense:
            torch._foreach_mul_(dense, factor)  # one fused kernel per device/dtype group
        for g in grads:
            if g.is_sparse:
                g.mul_(factor)

    def _register_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = [p.register_hook(self._last_micro_step_hook) for p in self._params() if p.requires_grad]

    def _last_micro_step_hook(self, grad: torch.Tensor) -> torch.Tensor | None:
        # Runs on the incoming gradient, before it is accumulated into .grad and before DDP's
        # reducer sees it; a no-op except on the last micro-step of a hooked accumulation.
        cycle = self._current_cycle()
        if cycle.hooked and self._position == cycle.steps - 1 and not self._loss_weighted:
            return grad * cycle.weights[-1]
        return None

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict plus the accumulation: its position and, in the middle
        of one, the plan and the gradients accumulated so far (in parameter order)."""
        accumulation: dict[str, Any] = {"position": self._position, "real_steps": self._real_steps,
                                        "reduction": self.reduction}
        if self._position:
            cycle = self._current_cycle()
            accumulation.update(steps=cycle.steps, weights=list(cycle.weights), hooked=cycle.hooked,
                                grads=[p.grad for p in self._params()], loss_weighted=bool(self._loss_weighted))
        return {"optimizer": self.optimizer.state_dict(), "accumulation": accumulation}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state. Resuming in the middle of an accumulation needs the
        same plan (``steps``) as when it was saved."""
        if "accumulation" not in state_dict:
            raise ValueError("not a flextrain.elastic.torch.Optimizer state dict (no 'accumulation'): "
                             "load a plain optimizer's state with optimizer.optimizer.load_state_dict")
        acc = state_dict["accumulation"]
        position = int(acc["position"])
        cycle = None
        if position:
            cycle = _Cycle(int(acc["steps"]), tuple(acc["weights"]), bool(acc["hooked"]))
            planned = self._plan_cycle()
            if planned.steps != cycle.steps:
                raise ElasticInitError(
                    f"the state was saved {position} micro-step(s) into an accumulation of steps={cycle.steps}, "
                    f"but the current plan has steps={planned.steps}: save at a step boundary "
                    "(when optimizer.stepped) to resume in another world")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._cycle, self._position, self._stepped = cycle, position, False
        self._real_steps, self._steps_loaded = int(acc["real_steps"]), True
        self._loss_weighted = bool(acc.get("loss_weighted")) if position else None
        self._scaled_at = position - 1 if self._loss_weighted else -1
        if position:
            for p, g in zip(self._params(), acc["grads"], strict=True):
                p.grad = None if g is None else g.detach().to(device=p.device, dtype=p.dtype, copy=True)


def _maybe_several_processes() -> bool:
    """Could this process's gradients be all-reduced (then the last micro-step needs hooks)?"""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    if session is not None:
        return session.world.processes > 1
    return os.environ.get("WORLD_SIZE", "1") not in ("", "1")


def no_sync(model: torch.nn.Module, optimizer: Optimizer) -> contextlib.AbstractContextManager:
    """The context for one micro-step's forward and backward under DDP: ``model.no_sync()`` when
    ``optimizer``'s next ``step()`` only accumulates (no all-reduce of partial gradients), a null
    context on the last micro-step (its backward all-reduces everything accumulated) and for
    models without ``no_sync`` (plain modules, ``DataParallel``)."""
    if optimizer.is_boundary or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


__all__ = ["report", "report_loss", "AdaScaleOptimizer", "AdaptiveBatchSampler", "ElasticInitError", "InfinityBatch", "LinearRuleOptimizer", "MemoryMonitor", "Optimizer", "RootRuleOptimizer", "Session",
           "SqrtRuleOptimizer", "State", "TraceBatchSampler", "init", "no_sync", "summary"]
