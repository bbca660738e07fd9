"""A batch sampler that follows a batch-size trace: each optimizer step's global batch from a schedule.

``TraceBatchSampler(dataset_size, trace, ...)`` is a ``batch_sampler`` for a
``DataLoader``. The trace (:class:`flextrain.elastic.schedule.BatchSchedule`:
a CSV path, a list, or an int) gives the GLOBAL batch ``G_s`` of every
optimizer step ``s``; each ``G_s`` must be a multiple of
``minibatch_size * num_replicas``. Step ``s`` takes the next ``G_s`` samples
of the epoch's shuffled order; rank ``r`` takes the ``r``-th contiguous block
of ``G_s / num_replicas`` of them and yields it as ``G_s / (num_replicas *
minibatch_size)`` minibatches of ``minibatch_size`` indices.

Epochs and steps (the contract the rule optimizers rely on):

* An epoch is one pass over the dataset, shuffled by ``(seed, epoch)``
  (:meth:`set_epoch`, as ``DistributedSampler``). Every sample is in exactly
  one minibatch of exactly one rank per epoch, for any trace and world.
* The step count runs on across epochs (the trace's ``step`` column is the
  global optimizer step), but a step never mixes two epochs: when fewer than
  ``G_s`` samples are left, the epoch's last step is *partial*: its ``R``
  samples are split over the ranks as evenly as possible (the first ``R %
  num_replicas`` ranks get one more) and each rank's share is cut into
  ``ceil(share / minibatch_size)`` minibatches as even as possible (none
  above ``minibatch_size``). A rank may get none of a partial step (``R <
  num_replicas``); the optimizer still joins that step's all-reduce. The
  next epoch starts with step ``s + 1`` (the reference dropped the leftover
  samples instead).
* Past the trace's end the last size holds.

The layout of an epoch is a pure function of ``(trace, dataset_size,
world, epoch)``: :meth:`shares` lists, for every step of the current epoch,
its global step number, its samples and this rank's minibatch sizes, which
is how the optimizers know where a step ends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from flextrain.elastic.schedule import BatchSchedule, ScheduleError
from flextrain.elastic.world import torch_world


@dataclass(frozen=True)
class StepShare:
    """One optimizer step of an epoch as one rank sees it."""

    step: int  # global optimizer step (counted across epochs from 0)
    samples: int  # samples in the whole step, all ranks: G_s, or fewer for an epoch's partial last step
    minibatches: tuple[int, ...]  # this rank's minibatch sizes, in order (empty: no share of a partial step)
    offset: int  # where this rank's share starts in the epoch's shuffled order
    total_minibatches: int  # minibatches of the step over all ranks


def _even(total: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(total, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class TraceBatchSampler(torch.utils.data.Sampler[list[int]]):
    """This rank's minibatches (lists of indices) for a batch-size trace; see the module docstring.

    ``num_replicas``/``rank`` default to :func:`flextrain.elastic.world.torch_world` (the process
    group, else ``WORLD_SIZE``/``RANK``, else one process). ``len(sampler)`` is the number of
    minibatches this rank yields in the current epoch (after ``start``, see :meth:`set_epoch`).
    """

    def __init__(self, dataset_size: int, trace: str | Path | Sequence[int] | int | BatchSchedule,
                 num_replicas: int | None = None, rank: int | None = None, *, minibatch_size: int,
                 seed: int = 0, shuffle: bool = True) -> None:
        if num_replicas is None or rank is None:
            world = torch_world()
            num_replicas = world.processes if num_replicas is None else num_replicas
            rank = world.rank if rank is None else rank
        self.dataset_size = _positive("dataset_size", dataset_size)
        self.num_replicas = _positive("num_replicas", num_replicas)
        self.minibatch_size = _positive("minibatch_size", minibatch_size)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must lie in [0, {num_replicas}), got {rank!r}")
        if dataset_size < num_replicas:
            raise ValueError(f"dataset_size {dataset_size} is below num_replicas {num_replicas}: "
                             "every rank needs a sample in every epoch")
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.schedule = BatchSchedule.of(trace)
        self.schedule.check_multiple_of(self.minibatch_size * self.num_replicas,
                                        what=f"minibatch_size x num_replicas ({self.minibatch_size} x "
                                             f"{self.num_replicas})")
        self.epoch = 0
        self.start = 0
        self._epoch_starts = [0]  # first global step of epochs 0, 1, ...
        self._shares: tuple[StepShare, ...] | None = None

    # ---- epochs ------------------------------------------------------------------------------
    def set_epoch(self, epoch: int, *, start: int = 0) -> None:
        """Shuffle and lay out epoch ``epoch``; ``start`` skips this rank's first ``start``
        minibatches of it (to resume mid-epoch from a checkpoint: the optimizer's ``minibatch``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self.epoch:
            self._shares = None
        self.epoch = epoch
        self.start = start
        if not 0 <= start <= len(self._minibatch_steps()):
            raise ValueError(f"start {start} outside this epoch's {len(self._minibatch_steps())} minibatches")

    def first_step(self, epoch: int | None = None) -> int:
        """The global step the epoch starts with."""
        epoch = self.epoch if epoch is None else epoch
        starts = self._epoch_starts
        while len(starts) <= epoch:
            first = starts[-1]
            if first >= self.schedule.length:  # past the trace: every epoch has the same steps
                per_epoch = -(-self.dataset_size // self.schedule.global_batch(first))
                return first + (epoch - len(starts) + 1) * per_epoch
            starts.append(first + self.schedule.steps_for(self.dataset_size, start_step=first))
        return starts[epoch]

    def global_batch(self, step: int) -> int:
        """The trace's global batch for ``step`` (the last size past the trace's end)."""
        return self.schedule.global_batch(step)

    def shares(self) -> tuple[StepShare, ...]:
        """Every step of the current epoch, with this rank's minibatch sizes (see the module docstring)."""
        if self._shares is None:
            self._shares = self._layout(self.epoch)
        return self._shares

    def _layout(self, epoch: int) -> tuple[StepShare, ...]:
        out, step, offset = [], self.first_step(epoch), 0
        n, b, r = self.num_replicas, self.minibatch_size, self.rank
        while offset < self.dataset_size:
            g = self.global_batch(step)
            samples = min(g, self.dataset_size - offset)
            per_rank = _even(samples, n)  # == (g // n,) * n for a full step
            counts = [-(-share // b) for share in per_rank]
            mine = _even(per_rank[r], counts[r]) if counts[r] else ()
            out.append(StepShare(step=step, samples=samples, minibatches=mine,
                                 offset=offset + sum(per_rank[:r]), total_minibatches=sum(counts)))
            offset += samples
            step += 1
        return tuple(out)

    def _minibatch_steps(self) -> list[int]:
        return [s.step for s in self.shares() for _ in s.minibatches]

    # ---- what the optimizer asks -------------------------------------------------------------
    def step_of_minibatch(self, index: int) -> int:
        """The global step this rank's ``index``-th minibatch of the current epoch belongs to
        (counted from the epoch's first minibatch, ignoring ``start``)."""
        return self._minibatch_steps()[index]

    def minibatches_in_step(self, step: int) -> int:
        """This rank's minibatches in global step ``step`` of the current epoch (0 if it has none)."""
        for share in self.shares():
            if share.step == step:
                return len(share.minibatches)
        raise ValueError(f"step {step} is not in epoch {self.epoch} (steps {self.shares()[0].step}.."
                         f"{self.shares()[-1].step})")

    def step_done(self, step: int) -> None:
        """Called by the rule optimizers after applying global step ``step``; a fixed trace has
        nothing to do (an adaptive sampler decides the next steps' batch size here)."""

    # ---- Sampler -----------------------------------------------------------------------------
    def order(self) -> list[int]:
        """The epoch's sample order (the same on every rank)."""
        if not self.shuffle:
            return list(range(self.dataset_size))
        g = torch.Generator().manual_seed(self.seed + self.epoch)  # as DistributedSampler
        return torch.randperm(self.dataset_size, generator=g).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order, index = self.order(), 0
        for share in self.shares():
            at = share.offset
            for size in share.minibatches:
                if index >= self.start:
                    yield order[at:at + size]
                at += size
                index += 1

    def __len__(self) -> int:
        return sum(len(s.minibatches) for s in self.shares()) - self.start

    def __repr__(self) -> str:
        return (f"TraceBatchSampler(dataset_size={self.dataset_size}, trace={self.schedule.source!r}, "
                f"num_replicas={self.num_replicas}, rank={self.rank}, minibatch_size={self.minibatch_size}, "
                f"epoch={self.epoch})")


__all__ = ["ScheduleError", "StepShare", "TraceBatchSampler"]
