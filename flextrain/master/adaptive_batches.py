"""``--batch-schedule adaptive``: a job's global batch chosen online from the gradient noise scale.

:class:`AdaptiveSchedule` is the online schedule the ledger queries like a
:class:`~flextrain.elastic.schedule.BatchSchedule` (``global_batch``, ``hand_out``, ``sizes``).
It starts at ``min_global_batch``. Decision points are the first hand-out of each epoch after the
first (``every=None``) or every global step that is a multiple of ``every``; at a decision point
the G of the steps from it on is :func:`~flextrain.elastic.noise.batch_for_noise_scale` of the
latest gradient noise scale the workers reported (the adascale rule's estimate, with their
heartbeats and in the position of every task ask), a multiple of ``min_global_batch`` clamped to
``[min_global_batch, max_global_batch]``; before any estimate G stays as it is.

**Contract with the ledger.** The ledger calls :meth:`hand_out` when it hands out the run of steps
starting at its ``next_step``: a pending decision point at or before that step is decided then,
and the run never crosses the next decision point (the steps after it get their G when handed
out, from the estimate of that time). Decisions are never revised: a step re-run after a round
re-forms (the ledger's ``next_step`` goes back to the round's model version) gets the G already
decided for it, and records map to steps by ``start + j*G`` as for any trace, so exactly-once
holds as for a trace.

**Persistence.** ``state()`` (every decision ``(step, G)``, the last epoch decided) travels in the
ledger's persisted state, with each checkpoint: a resumed job continues with the G decided for its
checkpoint's step and decides on from there. (Decisions after the checkpoint's step that a crash
loses are simply made again from fresh estimates.)
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable

from flextrain.elastic.noise import batch_for_noise_scale
from flextrain.elastic.schedule import steps_covering

log = logging.getLogger("flextrain.master")


class AdaptiveSchedule:
    """The global batch of each step as decided so far (see the module docstring).

    ``noise_scale`` returns the workers' latest σ²/μ² (None: no estimate yet); the master binds it
    to what heartbeats and task asks report (``JobMaster.adascale``). ``history`` lists every decision ``(step, G)``, step 0's ``min`` first.
    """

    source = "the adaptive schedule"

    def __init__(self, *, min_global_batch: int, max_global_batch: int, every: int | None = None,
                 noise_scale: Callable[[], float | None] = lambda: None) -> None:
        if not 0 < min_global_batch <= max_global_batch:
            raise ValueError(f"need 0 < min_global_batch ({min_global_batch}) <= max_global_batch "
                             f"({max_global_batch})")
        if every is not None and every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.min_global_batch, self.max_global_batch, self.every = min_global_batch, max_global_batch, every
        self.noise_scale = noise_scale
        self.history: list[tuple[int, int]] = [(0, min_global_batch)]
        self.epoch = 0  # the last epoch whose first hand-out was a decision point (per-epoch decisions)

    # ---- what a BatchSchedule offers ------------------------------------------------------------
    @property
    def sizes(self) -> tuple[int, int]:
        """The bounds: ``max(sizes)`` is the largest G any step can have (the ledger cuts shuffled
        epochs into pieces of it)."""
        return self.min_global_batch, self.max_global_batch

    def global_batch(self, step: int) -> int:
        """G of ``step`` as decided so far: the last decision at or before it."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.history[bisect.bisect_right([s for s, _ in self.history], step) - 1][1]

    @property
    def current(self) -> int:
        """The latest decision's G."""
        return self.history[-1][1]

    def steps_for(self, samples: int, *, start_step: int = 0) -> int:
        """Steps from ``start_step`` covering ``samples`` if G no longer changed."""
        return steps_covering(self.global_batch, samples, start_step=start_step)

    # ---- decisions ------------------------------------------------------------------------------
    def hand_out(self, step: int, *, epoch: int, max_steps: int) -> tuple[int, int]:
        """A run starting at ``step`` of a task of ``epoch`` is handed out: decide if a decision point
        is due, then return ``(G, run)``, ``run`` <= ``max_steps`` steps of G not crossing the next
        decision point."""
        if self.every is None:
            if epoch > self.epoch:  # the epoch's first hand-out (cut once none of the last one's tasks is TODO)
                self.epoch = epoch
                self._decide(step)
        elif (point := step - step % self.every) > self.history[-1][0]:
            self._decide(point)  # runs stop at points: ``step`` is the point itself, unless a round jumped
        G = self.global_batch(step)
        run = 1
        while run < max_steps and self.global_batch(step + run) == G and not self._point(step + run):
            run += 1
        return G, run

    def _point(self, step: int) -> bool:
        """Whether ``step`` is a decision point not yet decided (a run stops before it)."""
        return self.every is not None and step % self.every == 0 and step > self.history[-1][0]

    def _decide(self, step: int) -> None:
        scale = self.noise_scale()
        G = self.current if scale is None or math.isnan(scale) else batch_for_noise_scale(
            scale, lo=self.min_global_batch, hi=self.max_global_batch, unit=self.min_global_batch)
        # A decision at a step before the last one's (a round re-formed further back) cannot happen:
        # runs stop at undecided points, and a decided point is never decided again.
        self.history.append((step, G))
        log.info("adaptive batch: from step %d global batch %d (gradient noise scale %s)", step, G, scale)

    # ---- persistence ----------------------------------------------------------------------------
    def state(self) -> dict:
        return {"history": [list(d) for d in self.history], "epoch": self.epoch}

    def parse_state(self, state: dict | None) -> tuple[list[tuple[int, int]], int]:
        """``(history, epoch)`` of a :meth:`state` (None, a ledger persisted without one: afresh);
        ValueError for a malformed one (steps not increasing from 0, a G out of bounds)."""
        if state is None:
            return [(0, self.min_global_batch)], 0
        history = [(int(s), int(g)) for s, g in state["history"]]
        steps = [s for s, _ in history]
        if not history or steps[0] != 0 or steps != sorted(set(steps)) or not all(
                self.min_global_batch <= g <= self.max_global_batch for _, g in history):
            raise ValueError(f"batch history {state['history']!r}: steps must increase from 0 and each G lie "
                             f"in [{self.min_global_batch}, {self.max_global_batch}]")
        return history, int(state["epoch"])

    def restore(self, state: dict | None) -> None:
        """Take over :meth:`state` (see :meth:`parse_state`)."""
        self.history, self.epoch = self.parse_state(state)


__all__ = ["AdaptiveSchedule"]
