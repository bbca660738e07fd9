"""What ``init(global_batch_size, max_micro_batch)`` computes for a script: one framework-neutral plan.

A script asks for a global batch ``G`` per optimizer step and says that one
device holds at most ``M`` samples. Over the data-parallel world (``W``
replicas, :mod:`flextrain.elastic.world`) the step is planned exactly as a
flextrain job plans it (:func:`flextrain.elastic.planner.plan_step`, one
implementation): ``steps = ceil(G / (W*M))`` accumulation steps, and the ``G``
samples split over ``W*steps`` micro-batches as evenly as possible. ``G``
is never changed: where it does not split evenly, some micro-batches are one
sample larger, and each micro-step's loss weight makes the accumulated
gradient the exact mean over the ``G`` samples.

Which value a data loader gets (per process and micro-step, ``batch_size``):
one process per device (DDP, torchrun, ``flextrain run``): that device's
micro-batch; one process driving ``d`` devices (``torch.nn.DataParallel``,
which splits each batch over its devices): the sum of its ``d`` devices'
micro-batches, i.e. ``d`` times the per-device size. ``device_batch_size``
is always the per-device size, never above ``M``.

Every framework's ``init`` publishes the same attributes (:data:`ATTRIBUTES`,
from :meth:`Session.attributes`) and calls :func:`activate`, so that
framework-neutral readers (the seeds' compat modules) find the plan of the
latest ``init`` through :func:`current`, whichever framework made it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from flextrain.elastic.planner import StepPlan, plan_step
from flextrain.elastic.world import World


class ElasticInitError(ValueError):
    """``init`` arguments that cannot work, named in the message."""


def max_micro_batch_of(max_gpu_batch_size: Any = None, max_micro_batch: Any = None) -> Any:
    """The micro-batch limit ``M`` from ``init``'s two spellings of it (AIkit's positional
    ``max_gpu_batch_size`` or the keyword ``max_micro_batch``): exactly one must be given."""
    if max_gpu_batch_size is None and max_micro_batch is None:
        raise ElasticInitError("init needs the most samples one device holds: pass max_gpu_batch_size "
                               "(positional, AIkit's name) or max_micro_batch=")
    if max_gpu_batch_size is not None and max_micro_batch is not None:
        raise ElasticInitError(f"init got both max_gpu_batch_size={max_gpu_batch_size!r} and "
                               f"max_micro_batch={max_micro_batch!r}: they are one setting, pass one")
    return max_micro_batch if max_gpu_batch_size is None else max_gpu_batch_size


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ElasticInitError(f"{name} must be a positive integer, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ElasticInitError(f"{name} must be a positive integer, got {value}")
    return value


@dataclass(frozen=True)
class Session:
    """The plan of one optimizer step for this process, in a given world."""

    global_batch_size: int  # G, as asked: never changed
    max_micro_batch: int  # M: the most samples one device holds
    world: World
    plan: StepPlan  # over world.size replicas

    @classmethod
    def plan_for(cls, global_batch_size: Any, max_micro_batch: Any, world: World) -> Session:
        G = _positive_int("global_batch_size", global_batch_size)
        M = _positive_int("max_micro_batch (max_gpu_batch_size)", max_micro_batch)
        if G < world.size:
            raise ElasticInitError(
                f"global_batch_size ({G}) is smaller than the data-parallel width ({world.size} = "
                f"{world.processes} process(es) x {world.devices_per_process} device(s)): some replicas "
                "would get no samples; use a larger global batch or fewer replicas")
        return cls(G, M, world, plan_step(G, world.size, M))

    # ---- the attributes a script reads ------------------------------------------------
    @property
    def steps(self) -> int:
        """Micro-steps accumulated per optimizer step (1: no accumulation)."""
        return self.plan.accumulation_steps

    @property
    def world_size(self) -> int:
        """The data-parallel width (processes x devices per process); AIkit calls it ``gpus``."""
        return self.world.size

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def master(self) -> bool:
        return self.world.master

    def device_batch_sizes(self, replica: int) -> tuple[int, ...]:
        """Replica ``replica``'s micro-batch size at each micro-step."""
        return tuple(size for _, size in self.plan.slices(replica))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """What this process's loader yields at each micro-step of one optimizer step: its devices'
        micro-batches summed (one device: its own)."""
        d = self.world.devices_per_process
        first = self.world.rank * d
        per_device = [self.device_batch_sizes(r) for r in range(first, first + d)]
        return tuple(sum(sizes) for sizes in zip(*per_device))

    @property
    def batch_size(self) -> int:
        """The loader's batch size: the first (largest) of :attr:`batch_sizes`; all of them when
        :attr:`even`."""
        return self.batch_sizes[0]

    @property
    def device_batch_size(self) -> int:
        """The largest micro-batch one device gets (<= ``max_micro_batch``)."""
        return self.plan.micro_batches[0]

    @property
    def even(self) -> bool:
        """Every micro-batch the same size: a fixed-size loader gives the exact global batch."""
        return len(set(self.plan.micro_batches)) == 1

    @property
    def loss_weights(self) -> tuple[float, ...]:
        """Per micro-step: the factor for a loss averaged over that micro-batch so that the
        accumulated gradient, averaged over processes (as DDP does), is the mean over ``G``
        samples: ``batch_sizes[j] * processes / G`` (``1/steps`` when :attr:`even`)."""
        processes, G = self.world.processes, self.global_batch_size
        return tuple(size * processes / G for size in self.batch_sizes)

    def attributes(self) -> dict[str, Any]:
        """The module attributes every ``init`` publishes (:data:`ATTRIBUTES`), by name."""
        return {"steps": self.steps, "batch_size": self.batch_size, "batch_sizes": self.batch_sizes,
                "device_batch_size": self.device_batch_size, "global_batch_size": self.global_batch_size,
                "gpus": self.world_size, "world_size": self.world_size, "rank": self.rank,
                "master": self.master, "loss_weights": self.loss_weights, "session": self}

    def describe(self) -> str:
        """One line for logs: the world and the plan."""
        w = self.world
        split = "even" if self.even else f"uneven: micro-batches {sorted(set(self.plan.micro_batches))}"
        return (f"global batch {self.global_batch_size} over {w.size} replica(s) ({w.processes} process(es) x "
                f"{w.devices_per_process} device(s), from {w.source.value}): {self.steps} accumulation step(s), "
                f"loader batch {self.batch_size} per process, {self.device_batch_size} per device ({split})")


# What a framework's ``init`` sets on its module (None before the first init).
ATTRIBUTES = ("steps", "batch_size", "batch_sizes", "device_batch_size", "global_batch_size", "gpus",
              "world_size", "rank", "master", "loss_weights", "session")

_current: Session | None = None


def activate(session: Session) -> Session:
    """Make ``session`` the process's current plan (every framework's ``init`` calls this last)."""
    global _current
    if not isinstance(session, Session):
        raise TypeError(f"activate takes a Session, got {type(session).__name__}")
    _current = session
    return session


def current() -> Session | None:
    """The Session of the latest ``init`` in this process, any framework; None before one ran."""
    return _current


def environment_processes() -> int:
    """The processes the launcher says this world has (``WORLD_SIZE``; 1 when unset or unreadable)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE") or 1))
    except ValueError:
        return 1


def require_process_group(processes: int) -> None:
    """A world of several processes with no process group would step each process alone on its own
    share of G: replicas that drift apart, with nothing to say so. ElasticInitError, before anything
    is applied (the GA optimizer calls it at each real step: the group may be set up after init)."""
    import torch.distributed as dist

    if processes > 1 and not (dist.is_available() and dist.is_initialized()):
        raise ElasticInitError(
            f"this world has {processes} processes (WORLD_SIZE) but torch.distributed has no process group: "
            "every process would apply its own share of the global batch alone, and the replicas would drift "
            "apart; call torch.distributed.init_process_group() (\"gloo\" or \"nccl\": flextrain run and "
            "torchrun set MASTER_ADDR/MASTER_PORT) and wrap the model in DistributedDataParallel")


__all__ = ["ATTRIBUTES", "ElasticInitError", "Session", "activate", "current", "environment_processes",
           "max_micro_batch_of", "require_process_group"]
