"""The ``adascale`` LR rule of a job: AdaScale's gain, measured from the step's micro-batches.

Per optimizer step of ``R`` samples split into ``m`` non-empty micro-batches over all
ranks (the planner's split), each rank's backend measures ``Σ n_i‖g_i‖²`` of its own
micro-batches while it accumulates them (``ModelBackend.measure_micro_batches``: a hook
sees each micro-batch's gradient before it is added in). That one float64 scalar is
summed over the ranks by a tiny all-reduce next to the gradients'; then every rank holds
the same ``m``, ``R``, ``Σ n_i‖g_i‖²`` and reduced gradient (whose ``‖ḡ‖²`` each computes
alike), feeds the same :class:`~flextrain.elastic.noise.GradientNoise` and sets the same
LR, base × ``gain(R, ref)``, before the optimizer step. The estimates are identical on
every rank, so they travel like the model: in the state broadcast to a round's members
and in checkpoints (:meth:`AdaScaleRule.state`), and a resumed or re-formed round goes
on from them. A step of one micro-batch in all tells nothing about the noise: it keeps the
estimates, and the gain of ``R`` under them. Before any estimate the gain is 1; at
``R == ref`` it is exactly 1.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from flextrain.elastic.noise import GradientNoise

log = logging.getLogger("flextrain.worker")


class AdaScaleRule:
    """One job worker's AdaScale state: the shared noise estimates and the last step's gain."""

    def __init__(self, *, reference: int, smoothing: float = 0.99) -> None:
        self.reference = reference
        self.noise = GradientNoise(smoothing=smoothing)
        self.gain = 1.0
        self.stats = torch.zeros(1, dtype=torch.float64)  # Σ n_i‖g_i‖²: this rank's, then all ranks'
        self._set: float | None = None  # the factor now set on the optimizer (None: not set)
        self._G = 0  # the global batch of the last task (a change is logged)

    def follow(self, G: int, *, step: int) -> None:
        """A task of steps of ``G`` starts at ``step``: a change of G is logged (at INFO) with the gain."""
        if G != self._G:
            self._G = G
            log.info("from step %d: global batch %d, adascale rule: gain so far %g, gradient noise scale %s",
                     step, G, self.gain, self.noise_scale)

    def reduced(self, backend) -> list[torch.Tensor]:
        """What the step's all-reduce sums: the backend's gradient buffers and this rank's statistic
        (one extra float64 scalar: a buffer of a bfloat16 model could not carry it exactly)."""
        self.stats[0] = backend.micro_sqr
        return [*backend.buffers, self.stats]

    def set_lr(self, backend, plan) -> float:
        """Before the optimizer step of ``plan`` (its gradients reduced, the stats summed): observe
        it and set the backend's LR to base × the gain; returns the gain."""
        gain = self.step(micro_batches=sum(1 for n in plan.micro_batches if n), samples=plan.global_batch,
                         mean_sqr=backend.grad_sqr())
        if gain != self._set:
            backend.scale_lr(gain)
            self._set = gain
        return gain

    def step(self, *, micro_batches: int, samples: int, mean_sqr: float) -> float:
        """Observe the step whose summed :attr:`stats` are in place; returns its gain. A statistic
        that is not finite (a step about to be dropped) is never observed: it would poison the EMAs."""
        weighted_sqr = float(self.stats[0])
        if math.isfinite(weighted_sqr) and math.isfinite(mean_sqr):
            self.noise.observe(micro_batches=micro_batches, samples=samples, weighted_sqr=weighted_sqr,
                               mean_sqr=mean_sqr)
        self.gain = self.noise.gain(samples, self.reference)
        return self.gain

    @property
    def noise_scale(self) -> float | None:
        """σ²/μ² in samples (None before any estimate; inf while μ² is estimated as 0)."""
        return self.noise.noise_scale

    def state(self) -> dict[str, Any]:
        return {"gain": self.gain, **self.noise.state_dict()}

    def load(self, state: dict[str, Any] | None) -> None:
        """Load :meth:`state`; None (a checkpoint of a job without the rule) starts afresh."""
        self._set = None  # the loaded optimizer holds another LR: set it again
        if state is None:
            self.noise, self.gain = GradientNoise(smoothing=self.noise.smoothing), 1.0
            return
        self.noise.load_state_dict(state)
        self.gain = float(state["gain"])


__all__ = ["AdaScaleRule"]
