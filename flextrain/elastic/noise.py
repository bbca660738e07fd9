"""Gradient noise: the per-sample gradient variance and the true gradient's size, estimated from
the gradients of a step's micro-batches, and what they tell about the batch size.

With ``σ²`` the per-sample gradient variance (trace of the covariance) and ``μ²`` the squared
norm of the true gradient, one step's ``m`` micro-batch gradients ``g_i`` (``n_i`` samples each,
over every process) and their size-weighted mean ``ḡ`` over ``R = Σ n_i`` samples give unbiased
estimates, from ``E[Σ n_i‖g_i‖²] = Rμ² + mσ²`` and ``E‖ḡ‖² = μ² + σ²/R``::

    σ² ≈ (Σ n_i‖g_i‖² − R‖ḡ‖²) / (m − 1),     μ² ≈ ‖ḡ‖² − σ²/R

each smoothed by a bias-corrected exponential moving average and clipped at 0. From them:

* AdaScale's gain of a step of ``G`` samples against a reference batch ``ref``:
  ``(σ²/ref + μ²) / (σ²/G + μ²)`` (1 at ``G == ref``, between 1 and ``G/ref``);
* the gradient noise scale ``σ²/μ²`` (McCandlish et al.'s simple noise scale, the batch size
  past which a larger batch stops buying proportionally fewer steps; what AdaptDL/Pollux
  weigh against throughput).

Used by the AdaScale optimizer for scripts, by job workers (the ``adascale`` LR rule), and by
adaptive batch schedules. Plain floats: the caller sums the two norms over processes.
"""

from __future__ import annotations

import math
from typing import Any


class GradientNoise:
    def __init__(self, *, smoothing: float = 0.99) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing!r}")
        self.smoothing = smoothing
        self._ema = {"var": 0.0, "sqr": 0.0, "weight": 0.0}

    def observe(self, *, micro_batches: int, samples: int, weighted_sqr: float, mean_sqr: float) -> bool:
        """One step's statistics: ``micro_batches`` (m), ``samples`` (R), ``Σ n_i‖g_i‖²`` and ``‖ḡ‖²``.
        A step of one micro-batch says nothing about the variance: ignored (returns False)."""
        if micro_batches < 2:
            return False
        var = (weighted_sqr - samples * mean_sqr) / (micro_batches - 1)
        sqr = mean_sqr - var / samples
        beta = self.smoothing
        for key, value in (("var", var), ("sqr", sqr), ("weight", 1.0)):
            self._ema[key] = beta * self._ema[key] + (1.0 - beta) * value
        return True

    @property
    def variance(self) -> float | None:
        """The smoothed per-sample gradient variance σ² (None before any estimate)."""
        w = self._ema["weight"]
        return max(self._ema["var"] / w, 0.0) if w else None

    @property
    def sqr(self) -> float | None:
        """The smoothed squared norm of the true gradient μ² (None before any estimate)."""
        w = self._ema["weight"]
        return max(self._ema["sqr"] / w, 0.0) if w else None

    def gain(self, samples: int, reference: int) -> float:
        """AdaScale's gain of a step of ``samples`` against ``reference`` (1 before any estimate)."""
        var, sqr = self.variance, self.sqr
        if var is None or var / samples + sqr <= 0.0:
            return 1.0
        return (var / reference + sqr) / (var / samples + sqr)

    @property
    def noise_scale(self) -> float | None:
        """σ²/μ², in samples (None before any estimate; inf when the gradient is all noise)."""
        var, sqr = self.variance, self.sqr
        if var is None:
            return None
        return var / sqr if sqr > 0 else float("inf")

    def state_dict(self) -> dict[str, Any]:
        return {"ema": dict(self._ema), "smoothing": self.smoothing}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ema = {k: float(state["ema"][k]) for k in ("var", "sqr", "weight")}
        self.smoothing = float(state.get("smoothing", self.smoothing))


def batch_for_noise_scale(noise_scale: float, *, lo: int, hi: int, unit: int) -> int:
    """The decision rule without a throughput model, shared by scripts and jobs: the gradient noise
    scale ``σ²/μ²`` (samples) rounded to the nearest multiple of ``unit`` and clamped to ``[lo, hi]``
    (inf, μ² estimated as 0: ``hi``). ``lo`` and ``hi`` are what the caller allows; ``hi`` need not be a
    multiple of ``unit`` (the clamp returns it as is)."""
    target = hi if math.isinf(noise_scale) else round(noise_scale / unit) * unit
    return min(max(target, lo), hi)


__all__ = ["GradientNoise", "batch_for_noise_scale"]

