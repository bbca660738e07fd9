"""The data-parallel world a training script runs in, found the way the script was started.

A script calls ``flextrain.elastic.torch.init(G, M)`` (or ``.keras.init``)
without saying how it was launched. The world is taken from the first of:

1. an initialised ``torch.distributed`` process group (DDP under torchrun,
   or a group the script formed itself): its size and this process's rank;
2. the launcher's environment, ``WORLD_SIZE`` and ``RANK`` (torchrun,
   ``flextrain run`` script jobs, Kubernetes operators that set them), before
   the script has formed its group;
3. one process, driving every local accelerator (``torch.nn.DataParallel``,
   or a ``tf.distribute`` strategy's replicas): width = the device count, at
   least 1 (CPU).

``size`` is the data-parallel width: the number of model replicas that each
take a share of every step (processes x devices per process). ``processes``
and ``devices_per_process`` say how it is made up, which decides what a data
loader must be given (see :class:`flextrain.elastic.session.Session`).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class WorldSource(str, enum.Enum):
    """Where the world was read from."""

    PROCESS_GROUP = "process-group"  # torch.distributed is initialised
    ENVIRONMENT = "environment"  # WORLD_SIZE / RANK (torchrun, flextrain run)
    LOCAL_DEVICES = "local-devices"  # one process; its devices (DataParallel / tf.distribute)


@dataclass(frozen=True)
class World:
    """A data-parallel world as one process sees it."""

    processes: int  # processes taking part (1 for a single process)
    rank: int  # this process's rank among them
    devices_per_process: int  # model replicas each process drives (DataParallel width; else 1)
    source: WorldSource

    @property
    def size(self) -> int:
        """The data-parallel width: replicas that each take a share of every step."""
        return self.processes * self.devices_per_process

    @property
    def master(self) -> bool:
        return self.rank == 0

    def __post_init__(self) -> None:
        if self.processes < 1 or self.devices_per_process < 1 or not 0 <= self.rank < self.processes:
            raise ValueError(f"not a world: {self.processes} process(es), rank {self.rank}, "
                             f"{self.devices_per_process} device(s) per process")


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def from_environment(env: Mapping[str, str] | None = None) -> World | None:
    """The world ``WORLD_SIZE``/``RANK`` describe (one device per process), or None if unset."""
    env = os.environ if env is None else env
    size, rank = _env_int(env, "WORLD_SIZE"), _env_int(env, "RANK")
    if size is None:
        return None
    if rank is None:
        raise ValueError(f"WORLD_SIZE={size} is set but RANK is not: start the script with torchrun, "
                         "flextrain run, or set both")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"WORLD_SIZE={size}, RANK={rank}: the rank must lie in [0, WORLD_SIZE)")
    return World(processes=size, rank=rank, devices_per_process=1, source=WorldSource.ENVIRONMENT)


def torch_world(env: Mapping[str, str] | None = None) -> World:
    """The world of a PyTorch script (see the module docstring for the order)."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return World(processes=dist.get_world_size(), rank=dist.get_rank(), devices_per_process=1,
                     source=WorldSource.PROCESS_GROUP)
    found = from_environment(env)
    if found is not None:
        return found
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return World(processes=1, rank=0, devices_per_process=max(1, devices), source=WorldSource.LOCAL_DEVICES)


def keras_world(env: Mapping[str, str] | None = None) -> World:
    """The world of a Keras script: ``WORLD_SIZE``/``RANK``, else the replicas of the current
    ``tf.distribute`` strategy (1 without one)."""
    found = from_environment(env)
    if found is not None:
        return found
    import tensorflow as tf

    replicas = int(tf.distribute.get_strategy().num_replicas_in_sync)
    return World(processes=1, rank=0, devices_per_process=max(1, replicas), source=WorldSource.LOCAL_DEVICES)


WorldFinder = Callable[[], World]

# ---- several processes need a process group (session.require_process_group) ---------------
def warn_if_alone() -> None:
    """Launched as several processes (WORLD_SIZE) with no process group, each trains on its own loader's
    data alone (InfinityBatch's own loop: the same work N times over, or N models): a warning."""
    import warnings

    world = torch_world()
    if world.source is WorldSource.ENVIRONMENT and world.processes > 1:
        warnings.warn(f"WORLD_SIZE={world.processes} but torch.distributed has no process group: each of the "
                      f"{world.processes} processes trains alone on its loader's data; for data parallelism call "
                      "torch.distributed.init_process_group(), wrap the model in DistributedDataParallel and give "
                      "each process its share of the data (a DistributedSampler)", stacklevel=3)


__all__ = ["World", "WorldFinder", "WorldSource", "from_environment", "keras_world", "torch_world", "warn_if_alone"]
