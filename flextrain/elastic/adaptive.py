"""An adaptive global batch for scripts: each epoch's (or every N steps') G chosen from the gradient noise.

``AdaptiveBatchSampler(dataset_size, *, min_global_batch, max_global_batch, minibatch_size, ...)``
is a :class:`~flextrain.elastic.trace_sampler.TraceBatchSampler` whose trace is written as
training goes. It starts at ``min_global_batch``; at each decision point it reads a
:class:`~flextrain.elastic.noise.GradientNoise` (σ², μ²: the AdaScale optimizer's estimate) and
picks the G of the steps that follow, a multiple of ``minibatch_size × num_replicas`` in
``[min_global_batch, max_global_batch]``:

* without a throughput model (``throughput=None``): the gradient noise scale ``B = σ²/μ²``
  rounded to the nearest multiple and clamped (McCandlish et al.'s critical batch: below it a
  larger batch buys nearly proportionally fewer steps, above it hardly any);
* with ``throughput(G)`` (samples/s of a step of G, measured or modelled by the script): the
  G maximising Pollux's goodput ``E(G) · throughput(G)``, ``E(G) = gain(G, min) / (G / min)``
  the statistical efficiency (AdaScale's gain per sample against the smallest batch); ties go
  to the smaller G.

Before any estimate (σ² is unknown until a step of ≥ 2 minibatches) G stays as it is.

**Decision points and who triggers them.** Decisions are made at step boundaries only: when
the optimizer finishes step ``s - 1`` it calls :meth:`step_done` (the rule optimizers of
:mod:`flextrain.elastic.rules` do, after every real step), and if ``s`` is a decision point the
G of steps ``s, s+1, ...`` is chosen then. Decision points are the first step of each epoch
(``every=None``) or every global step that is a multiple of ``every``. The decision reads only
the noise statistics, which the optimizer all-reduces (identical on every rank), at the same
step on every rank: every rank makes the same decision without any communication of its own.

**The noise source.** ``noise=`` names the GradientNoise to read; when it is None,
``AdaScaleOptimizer(inner, sampler, ref)`` binds its own ``.noise`` (so the LR follows
AdaScale's gain for the G chosen here). Without a noise source G stays at the minimum.

**Exactly-once.** Steps already handed out keep their G; a decision changes only the steps
after it, so the epoch's layout (:meth:`shares`) is recomputed from that step on, the samples
before it untouched. Iteration reads the layout step by step, so a decision mid-epoch takes
effect at the next step of the running iteration. Every sample is still in exactly one minibatch
of one rank per epoch; the epoch's last step may be partial as for any trace. ``len(sampler)``
and :meth:`shares` describe the rest of the epoch as if G no longer changed.

A data loader must not hand out a step's minibatches before the decision for that step: with
``every`` set, iterate the sampler in the training process (``num_workers=0``, or workers that
only load samples); a decision for a step already handed out raises RuntimeError.
Per-epoch decisions are made before the next epoch's iteration starts.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

# batch_for_noise_scale lives in noise.py (no torch): the master and the CLI import it without torch.
from flextrain.elastic.noise import GradientNoise, batch_for_noise_scale
from flextrain.elastic.schedule import steps_covering
from flextrain.elastic.trace_sampler import TraceBatchSampler, _positive


class _Decisions:
    """The schedule as decided so far: the G of step ``s`` is that of the last decision at or before
    ``s`` (the interface :class:`TraceBatchSampler` reads from a BatchSchedule)."""

    source = "the adaptive schedule"

    def __init__(self, history: list[tuple[int, int]]) -> None:
        self.steps = [s for s, _ in history]
        self.sizes = [g for _, g in history]

    def global_batch(self, step: int) -> int:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.sizes[bisect.bisect_right(self.steps, step) - 1]

    @property
    def length(self) -> int:
        """Steps up to the last change (the last G holds after them)."""
        return self.steps[-1] + 1

    def steps_for(self, samples: int, *, start_step: int = 0) -> int:
        return steps_covering(self.global_batch, samples, start_step=start_step)


class AdaptiveBatchSampler(TraceBatchSampler):
    """This rank's minibatches for a global batch chosen online from the gradient noise scale.

    See the module docstring. ``history`` lists ``(step, G)`` for the first step and every
    decision that changed G; ``decisions`` counts the decisions made. Also a ``batch_sampler``
    for a DataLoader (``num_workers=0`` when deciding mid-epoch). ``min_global_batch`` must give
    ≥ 2 minibatches per step (the noise estimate needs two); ``throughput`` must be the same
    function on every rank.
    """

    def __init__(self, dataset_size: int, *, min_global_batch: int, max_global_batch: int, minibatch_size: int,
                 num_replicas: int | None = None, rank: int | None = None, seed: int = 0, shuffle: bool = True,
                 every: int | None = None, noise: GradientNoise | None = None,
                 throughput: Callable[[int], float] | None = None) -> None:
        _positive("min_global_batch", min_global_batch)
        _positive("max_global_batch", max_global_batch)
        if every is not None:
            _positive("every", every)
        super().__init__(dataset_size, min_global_batch, num_replicas, rank, minibatch_size=minibatch_size,
                         seed=seed, shuffle=shuffle)  # checks min against the unit
        self.unit = self.minibatch_size * self.num_replicas
        if max_global_batch < min_global_batch or max_global_batch % self.unit:
            raise ValueError(f"max_global_batch {max_global_batch} must be >= min_global_batch {min_global_batch} "
                             f"and a multiple of minibatch_size x num_replicas ({self.unit})")
        if min_global_batch // self.minibatch_size < 2:
            raise ValueError(f"min_global_batch {min_global_batch} is one minibatch of {self.minibatch_size}: "
                             "the gradient noise is estimated from >= 2 minibatches per step")
        self.min_global_batch, self.max_global_batch = min_global_batch, max_global_batch
        self.every = every
        self.noise = noise
        self.throughput = throughput
        self.decisions = 0
        self._decided = 0  # the last decision point handled (step 0: the minimum)
        self._yielded = -1  # the last step whose minibatches the iteration handed out
        self._set_history([(0, min_global_batch)])

    def _set_history(self, history: list[tuple[int, int]]) -> None:
        self.schedule = _Decisions(history)
        self._epoch_starts = [0]
        self._shares = None

    @property
    def history(self) -> list[tuple[int, int]]:
        """``(step, G)``: G from that global step on, for step 0 and every decision that changed G."""
        return list(zip(self.schedule.steps, self.schedule.sizes))

    # ---- the rule -------------------------------------------------------------------------------
    def efficiency(self, global_batch: int) -> float:
        """Statistical efficiency of a step of ``global_batch``: its progress per sample relative to
        a step of ``min_global_batch``, ``gain(G, min) / (G / min)`` (1 at the minimum; ``min / G``
        before any estimate, when the gain is taken as 1)."""
        if self.noise is None:
            return self.min_global_batch / global_batch
        return self.noise.gain(global_batch, self.min_global_batch) * self.min_global_batch / global_batch

    def choose(self) -> int:
        """The G the current noise estimate picks (the current G before any estimate)."""
        current = self.schedule.sizes[-1]
        if self.noise is None or self.noise.variance is None:
            return current
        lo, hi, unit = self.min_global_batch, self.max_global_batch, self.unit
        if self.throughput is None:
            return batch_for_noise_scale(self.noise.noise_scale, lo=lo, hi=hi, unit=unit)
        best, best_value = current, -math.inf
        for g in range(lo, hi + 1, unit):
            rate = float(self.throughput(g))
            if not rate > 0 or math.isinf(rate):
                raise ValueError(f"throughput({g}) must be a positive finite number of samples/s, got {rate!r}")
            value = self.efficiency(g) * rate
            if value > best_value:
                best, best_value = g, value
        return best

    def _is_decision_point(self, step: int) -> bool:
        if self.every is not None:
            return step % self.every == 0
        epoch = 0
        while (first := self.first_step(epoch)) < step:
            epoch += 1
        return first == step

    # ---- what the optimizer calls ---------------------------------------------------------------
    def step_done(self, step: int) -> None:
        """Global step ``step`` was applied (its noise statistics observed): if ``step + 1`` is a
        decision point, choose the G of the steps from it on. Repeated or earlier steps are ignored."""
        nxt = step + 1
        if nxt <= self._decided or not self._is_decision_point(nxt):
            return
        if nxt <= self._yielded:
            raise RuntimeError(f"step {nxt}'s minibatches were handed out before its batch size was decided "
                               "(a DataLoader iterating the sampler ahead, e.g. num_workers > 0): iterate the "
                               "sampler in the training process or decide per epoch (every=None)")
        g = self.choose()
        self._decided = nxt
        self.decisions += 1
        if g != self.schedule.sizes[-1]:
            history = self.history + [(nxt, g)]
            starts = [s for s in self._epoch_starts if s <= nxt]  # epochs from before the change stand
            self._set_history(history)
            self._epoch_starts = starts

    # ---- iteration: the layout is read step by step, so decisions take effect mid-epoch ---------
    def __iter__(self):
        order, index, k = self.order(), 0, 0
        while k < len(shares := self.shares()):
            share = shares[k]
            at = share.offset
            for size in share.minibatches:
                if index >= self.start:
                    self._yielded = max(self._yielded, share.step)
                    yield order[at:at + size]
                at += size
                index += 1
            k += 1

    # ---- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The decisions so far and the epoch (the noise is the optimizer's to save)."""
        return {"history": [list(h) for h in self.history], "decided": self._decided, "decisions": self.decisions,
                "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a run: its decisions, then ``set_epoch(epoch, start=optimizer.minibatch)``."""
        history = [(int(s), int(g)) for s, g in state["history"]]
        bad = [g for _, g in history if g % self.unit or not self.min_global_batch <= g <= self.max_global_batch]
        if bad:
            raise ValueError(f"saved batch sizes {bad} are not multiples of {self.unit} in [{self.min_global_batch}, "
                             f"{self.max_global_batch}]")
        self._set_history(history)
        self._decided, self.decisions = int(state["decided"]), int(state["decisions"])
        self._yielded = -1
        self.set_epoch(int(state["epoch"]))

    def __repr__(self) -> str:
        return (f"AdaptiveBatchSampler(dataset_size={self.dataset_size}, min_global_batch={self.min_global_batch}, "
                f"max_global_batch={self.max_global_batch}, minibatch_size={self.minibatch_size}, "
                f"num_replicas={self.num_replicas}, rank={self.rank}, every={self.every}, epoch={self.epoch}, "
                f"G={self.schedule.sizes[-1]})")


__all__ = ["AdaptiveBatchSampler", "batch_for_noise_scale"]
