"""The batch planner: how one optimizer step's G samples are split.

DESIGN.md, "Elastic batch semantics": with global batch ``G``, micro-batch
limit ``M`` and ``N`` live workers, accumulation steps ``k = ceil(G / (N*M))``
and the G samples are split over ``N*k`` micro-batches as evenly as possible.
Worker ``r`` takes micro-batches ``r*k .. r*k+k-1``, which are contiguous in
the step's record range, so each worker reads one contiguous slice per step.

Every worker scales its micro-batch loss sums by ``1/G`` and the collective
sums gradients, so the step's gradient is exactly the mean over G samples no
matter how unevenly they were split. The master and every worker compute the
same plan from the same three numbers; nothing about it travels on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class StepPlan:
    global_batch: int
    world_size: int
    accumulation_steps: int
    # Size of every micro-batch, in step order; len == world_size * accumulation_steps.
    micro_batches: tuple[int, ...]

    def slices(self, rank: int) -> tuple[tuple[int, int], ...]:
        """``(offset, size)`` of rank's micro-batches, offsets within the step."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size}")
        k = self.accumulation_steps
        offset = sum(self.micro_batches[: rank * k])
        out = []
        for size in self.micro_batches[rank * k : (rank + 1) * k]:
            out.append((offset, size))
            offset += size
        return tuple(out)

    def span(self, rank: int) -> tuple[int, int]:
        """``[start, end)`` within the step covered by rank's micro-batches."""
        parts = self.slices(rank)
        return parts[0][0], parts[-1][0] + parts[-1][1]


@lru_cache(maxsize=256)
def plan_step(global_batch: int, world_size: int, max_micro_batch: int) -> StepPlan:
    """Plan one optimizer step of ``global_batch`` samples over ``world_size`` workers."""
    for name, value in (
        ("global_batch", global_batch),
        ("world_size", world_size),
        ("max_micro_batch", max_micro_batch),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    k = -(-global_batch // (world_size * max_micro_batch))
    parts = world_size * k
    base, extra = divmod(global_batch, parts)
    sizes = tuple(base + 1 if i < extra else base for i in range(parts))
    return StepPlan(global_batch, world_size, k, sizes)
