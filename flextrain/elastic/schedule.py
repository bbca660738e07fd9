"""Global-batch schedules and learning-rate rules, shared by scripts and jobs.

A **schedule** gives the global batch ``G`` of every optimizer step. It is
a trace (a CSV ``step,batchsize`` as elastic-learning-rate-evaluation writes
them, a list of sizes, or a constant): the step is the global optimizer step
counted across epochs from 0; steps must appear in order without gaps, and
past the trace's end the last size holds (the reference raises IndexError
there; a job that trains a little longer than its trace should not die).

A **rule** scales the learning rate for a step of ``G`` against the
reference batch the base LR was tuned for: ``linear`` lr·G/ref, ``sqrt``
lr·√(G/ref), ``none`` lr. (AdaScale's gain needs gradient statistics; it
lives with the optimizers that measure them.)

Both are checked when read, with the file and line of a bad entry named, so
a job with a bad trace fails at submission, before any process starts.
"""

from __future__ import annotations

import csv
import enum
import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


class ScheduleError(ValueError):
    """A trace that cannot be used; the message names the file (or argument) and the line."""


class LRRule(str, enum.Enum):
    NONE = "none"
    LINEAR = "linear"
    SQRT = "sqrt"
    ADASCALE = "adascale"


def lr_factor(rule: LRRule | str, global_batch: int, reference_batch: int) -> float:
    """The factor the base learning rate is multiplied by for a step of ``global_batch`` samples
    (``linear``, ``sqrt``, ``none``; ``adascale`` needs a measured gain: see its optimizer)."""
    rule = LRRule(rule)
    if reference_batch < 1:
        raise ScheduleError(f"the reference batch size must be a positive integer, got {reference_batch}")
    ratio = global_batch / reference_batch
    if rule is LRRule.LINEAR:
        return ratio
    if rule is LRRule.SQRT:
        return math.sqrt(ratio)
    if rule is LRRule.NONE:
        return 1.0
    raise ScheduleError("the adascale rule scales by a gain measured from gradients, not by a formula of G")


@dataclass(frozen=True)
class BatchSchedule:
    """The global batch of each optimizer step: ``sizes[step]``, the last size past the end."""

    sizes: tuple[int, ...]
    source: str = "the schedule"  # where it came from, for messages

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ScheduleError(f"{self.source}: no batch sizes (an empty trace)")

    def global_batch(self, step: int) -> int:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.sizes[min(step, len(self.sizes) - 1)]

    @property
    def length(self) -> int:
        """Steps the trace itself covers (the last size holds after them)."""
        return len(self.sizes)

    def steps_for(self, samples: int, *, start_step: int = 0) -> int:
        """Optimizer steps, from ``start_step``, whose global batches add up to at least ``samples``."""
        return steps_covering(self.global_batch, samples, start_step=start_step)

    def hand_out(self, step: int, *, epoch: int, max_steps: int) -> tuple[int, int]:
        """What the job ledger asks when it hands out steps from ``step`` (of a task of ``epoch``):
        ``(G, run)``, ``run`` <= ``max_steps`` steps that all have the G of ``step``. (An online
        schedule decides here; a trace is fixed.)"""
        G = self.global_batch(step)
        run = 1
        while run < max_steps and self.global_batch(step + run) == G:
            run += 1
        return G, run

    def check_multiple_of(self, unit: int, *, what: str) -> None:
        """Every size a multiple of ``unit`` (e.g. minibatch x replicas), naming the first that is not."""
        for index, size in enumerate(self.sizes):
            if size % unit:
                raise ScheduleError(f"{self.source}: step {index}: batch size {size} is not a multiple of "
                                    f"{what} ({unit})")

    @classmethod
    def constant(cls, size: int) -> BatchSchedule:
        return cls((_size(size, "the batch size"),), source=f"constant batch size {size}")

    @classmethod
    def of_sizes(cls, sizes: Iterable[int], *, source: str = "the trace") -> BatchSchedule:
        out = tuple(_size(s, f"{source}: step {i}") for i, s in enumerate(sizes))
        return cls(out, source=source)

    @classmethod
    def read(cls, path: str | Path) -> BatchSchedule:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ScheduleError(f"cannot read the batch-size trace {path}: {exc.strerror or exc}") from None
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, *, source: str = "the trace") -> BatchSchedule:
        """A CSV with the header ``step,batchsize`` and one row per step, from step 0 in order."""
        rows = list(csv.reader(io.StringIO(text)))
        numbered = [(n, [c.strip() for c in row]) for n, row in enumerate(rows, 1) if any(c.strip() for c in row)]
        if not numbered:
            raise ScheduleError(f"{source}: empty: a trace is a CSV with the header 'step,batchsize' and a row per step")
        line, header = numbered[0]
        if [h.lower() for h in header] != ["step", "batchsize"]:
            raise ScheduleError(f"{source}: line {line}: the header must be 'step,batchsize', got {','.join(header)!r}")
        sizes = []
        for line, row in numbered[1:]:
            if len(row) != 2:
                raise ScheduleError(f"{source}: line {line}: expected 'step,batchsize', got {','.join(row)!r}")
            step = _integer(row[0], f"{source}: line {line}: step")
            if step != len(sizes):
                raise ScheduleError(f"{source}: line {line}: step {step} out of order: expected step {len(sizes)} "
                                    "(steps count from 0, one row each, in order)")
            sizes.append(_size(_integer(row[1], f"{source}: line {line}: batchsize"), f"{source}: line {line}"))
        if not sizes:
            raise ScheduleError(f"{source}: only a header: no steps")
        return cls(tuple(sizes), source=source)

    @classmethod
    def of(cls, trace: str | Path | Sequence[int] | int) -> BatchSchedule:
        """A path to a CSV trace, a list of sizes, or an int (a constant size)."""
        if isinstance(trace, BatchSchedule):
            return trace
        if isinstance(trace, bool):
            raise ScheduleError(f"a trace is a CSV path, a list of batch sizes or an int, got {trace!r}")
        if isinstance(trace, int):
            return cls.constant(trace)
        if isinstance(trace, (str, Path)):
            return cls.read(trace)
        if isinstance(trace, Sequence):
            return cls.of_sizes(trace, source="the trace list")
        raise ScheduleError(f"a trace is a CSV path, a list of batch sizes or an int, got {type(trace).__name__}")


def steps_covering(global_batch: Callable[[int], int], samples: int, *, start_step: int = 0) -> int:
    """Optimizer steps from ``start_step`` whose ``global_batch(step)`` add up to at least ``samples``."""
    step, left = start_step, samples
    while left > 0:
        left -= global_batch(step)
        step += 1
    return step - start_step


def _integer(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ScheduleError(f"{where}: {text!r} is not an integer") from None


def _size(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{where}: a batch size is a positive integer, got {value!r}")
    if value < 1:
        raise ScheduleError(f"{where}: a batch size must be positive, got {value}")
    return value


__all__ = ["BatchSchedule", "LRRule", "ScheduleError", "lr_factor", "steps_covering"]
