"""Optimizers that follow a :class:`TraceBatchSampler`: accumulate, all-reduce and step with a scaled LR.

``LinearRuleOptimizer(internal_optimizer, sampler, ref_batchsize, log_steps=None)`` (and
``SqrtRuleOptimizer`` = ``RootRuleOptimizer``, ``AdaScaleOptimizer``) wraps an optimizer in
place. The script calls ``loss.backward(); optimizer.step()`` once per minibatch the sampler
yields (the loss is the mean over the minibatch); ``zero_grad()`` is a no-op, the wrapper
zeroes after every real step. ``step()`` knows from the sampler's layout
(:meth:`TraceBatchSampler.shares`) which optimizer step the minibatch belongs to:

* not its last minibatch on this rank: the gradient is accumulated, nothing else;
* its last: the accumulated gradient is made the mean over the step's samples (each
  minibatch's gradient weighted by its size; sum over minibatches and ranks, then divide by
  the step's samples), all-reduced over the process group when one with several processes is
  initialised, and the inner optimizer steps with every param group's LR multiplied by the
  rule's factor for the step's samples: linear ``G/ref``, sqrt ``sqrt(G/ref)``, AdaScale the
  measured gain. The LR is put back right after, so the factor never compounds and LR
  schedulers keep acting on the base LR.

After each real step the optimizer calls ``sampler.step_done(step)`` (an
:class:`~flextrain.elastic.adaptive.AdaptiveBatchSampler` may then choose the next steps' G,
re-laying out the rest of the epoch; the optimizer reads the layout again each call).

A rank with no share of an epoch's partial last step (fewer samples than ranks) joins that
step's all-reduce with a zero gradient at its own last ``step()`` call of the epoch, so every
rank applies every update. Do not wrap the model in DDP: the optimizer does the all-reduce.

The optimizer follows the sampler's epoch: call ``set_epoch(epoch)`` on both (a mismatch is an
error naming both); its position wraps to the start of the epoch after its last minibatch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

from flextrain.elastic.adaptive import AdaptiveBatchSampler
from flextrain.elastic.noise import GradientNoise
from flextrain.elastic.schedule import lr_factor
from flextrain.elastic.trace_sampler import StepShare, TraceBatchSampler
from flextrain.elastic.wrapping import WrappedOptimizer

log = logging.getLogger(__name__)


class _RuleOptimizer(WrappedOptimizer):
    """The common machinery; subclasses give :meth:`_factor` (and AdaScale its statistics)."""

    rule = "none"

    def __init__(self, internal_optimizer: torch.optim.Optimizer, sampler: TraceBatchSampler,
                 ref_batchsize: int, log_steps: int | None = None) -> None:
        super().__init__(internal_optimizer, argument="internal_optimizer")
        if not isinstance(sampler, TraceBatchSampler):
            raise TypeError(f"sampler must be a TraceBatchSampler, got {type(sampler).__name__}")
        if isinstance(ref_batchsize, bool) or not isinstance(ref_batchsize, int) or ref_batchsize < 1:
            raise ValueError(f"ref_batchsize must be a positive integer, got {ref_batchsize!r}")
        if log_steps is not None and (not isinstance(log_steps, int) or log_steps < 1):
            raise ValueError(f"log_steps must be a positive integer or None, got {log_steps!r}")
        self.sampler = sampler
        self.ref_batchsize = ref_batchsize
        self.log_steps = log_steps
        self._epoch = sampler.epoch
        self._position = 0  # step() calls made in the current epoch
        self._calls: list[tuple[int, int]] | None = None  # per call: (index into shares, minibatch)
        self._calls_of: tuple[StepShare, ...] | None = None  # the layout _calls was built from
        self.real_steps = 0
        self.stepped = False  # the last step() call ran the inner step
        self.last_step: int | None = None  # global step, samples and LRs of the last real step
        self.last_batch: int | None = None
        self.last_lr: list[float] | None = None
        internal_optimizer.zero_grad(set_to_none=True)  # nothing from before the wrap leaks in


    def __repr__(self) -> str:
        return f"{type(self).__name__}(ref_batchsize={self.ref_batchsize}, {self.optimizer!r})"

    # ---- epochs ------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def minibatch(self) -> int:
        """``step()`` calls made in the current epoch: the ``start`` to resume the sampler at."""
        return self._position

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (call the sampler's too). The same epoch as now keeps the position,
        so a script resumed from a checkpoint mid-epoch calls it as usual; another epoch drops an
        unfinished step's gradients (with a warning)."""
        if epoch == self._epoch:
            return
        if self._position:
            log.warning("set_epoch(%d) in the middle of epoch %d (after %d minibatches): the "
                        "unfinished step's gradients are dropped", epoch, self._epoch, self._position)
            self._drop_accumulation()
        self._epoch, self._position, self._calls = epoch, 0, None

    def _epoch_calls(self) -> list[tuple[int, int]]:
        if self._calls is None or self._calls_of is not self.sampler.shares():  # an adaptive sampler re-lays out
            if self.sampler.epoch != self._epoch:
                raise ValueError(f"the sampler is at epoch {self.sampler.epoch} but the optimizer at epoch "
                                 f"{self._epoch}: call set_epoch(epoch) on both before each epoch")
            self._calls_of = self.sampler.shares()
            self._calls = [(i, j) for i, share in enumerate(self._calls_of) for j in range(len(share.minibatches))]
        return self._calls

    # ---- stepping ----------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """A no-op: the optimizer zeroes the gradients itself after every real step."""

    def step(self, closure: Any = None) -> bool:
        """Account for one minibatch's backward; returns True when it ran a real step."""
        if closure is not None:
            raise ValueError("step() takes no closure: each minibatch's backward runs in the script")
        calls = self._epoch_calls()
        if self._position >= len(calls):
            raise RuntimeError("more step() calls than the sampler's minibatches in this epoch")
        shares = self.sampler.shares()
        i, j = calls[self._position]
        share = shares[i]
        self.stepped = False
        if j + 1 < len(share.minibatches):
            self._accumulate(share.minibatches[j], share.minibatches[j + 1])
        else:
            self._finish(share, share.minibatches[j])
            # Steps this rank has no share of (only an epoch's partial last step) follow at once;
            # the layout is read again after each step (an adaptive sampler may have changed it).
            k = i + 1
            while k < len(shares := self.sampler.shares()) and not shares[k].minibatches:
                self._finish(shares[k], None)
                k += 1
        self._position += 1
        if self._position == len(self._epoch_calls()):
            self._position, self._calls = 0, None  # the epoch is done; the next pass starts over
        return self.stepped

    def _params(self) -> Iterator[torch.Tensor]:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    yield p

    def _scale(self, factor: float) -> None:
        if factor != 1.0:
            grads = [p.grad for p in self._params() if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, factor)

    def _accumulate(self, size: int, next_size: int) -> None:
        # .grad is kept in units of the next minibatch's size: .grad * next_size is the sum of
        # size-weighted minibatch gradients so far (a rescale only where the sizes differ).
        self._scale(size / next_size)

    def _drop_accumulation(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _finish(self, share: StepShare, last_size: int | None) -> None:
        if last_size is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self._scale(last_size / share.samples)
        self._all_reduce()
        self._apply(share, self._factor(share))

    def _all_reduce(self, extra: torch.Tensor | None = None) -> None:
        """Sum the gradients (and ``extra``) over the process group, if there is one of several."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            if self.sampler.num_replicas > 1:  # each rank would step alone on its share: replicas drift apart
                raise RuntimeError(
                    f"the sampler has num_replicas={self.sampler.num_replicas} but torch.distributed has no "
                    "process group to sum the gradients over: call torch.distributed.init_process_group() "
                    "first (flextrain run and torchrun set MASTER_ADDR/MASTER_PORT)")
            return
        if dist.get_world_size() == 1:
            return
        if dist.get_world_size() != self.sampler.num_replicas:
            raise RuntimeError(f"the process group has {dist.get_world_size()} processes but the sampler "
                               f"num_replicas={self.sampler.num_replicas}")
        params = list(self._params())
        for p in params:
            if p.grad is None:  # every rank must contribute the same tensors
                p.grad = torch.zeros_like(p)
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for p in params:
            by_kind.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in by_kind.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            at = 0
            for g in grads:
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()
        if extra is not None:
            dist.all_reduce(extra)

    def _factor(self, share: StepShare) -> float:
        raise NotImplementedError

    def _apply(self, share: StepShare, factor: float) -> None:
        groups = self.optimizer.param_groups
        base = [group["lr"] for group in groups]
        for group, lr in zip(groups, base):
            group["lr"] = lr * factor
        try:
            self.optimizer.step()
            self.last_lr = [float(group["lr"]) for group in groups]
        finally:
            for group, lr in zip(groups, base):
                group["lr"] = lr  # the base LR, never the scaled one, is what persists
        self.optimizer.zero_grad(set_to_none=True)
        self.stepped = True
        self.real_steps += 1
        self.last_step, self.last_batch = share.step, share.samples
        self.sampler.step_done(share.step)
        if self.log_steps and share.step % self.log_steps == 0 and self.sampler.rank == 0:
            log.info("%s: step %d, global batch %d, lr %s%s", type(self).__name__, share.step, share.samples,
                     ", ".join(f"{lr:.6g}" for lr in self.last_lr), self._log_extra())

    def _log_extra(self) -> str:
        return ""

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state, the position in the epoch and, mid-step, the gradients
        accumulated so far (resume them with the same sampler layout: same trace and world)."""
        return {"optimizer": self.optimizer.state_dict(), "rule": self.rule, "ref_batchsize": self.ref_batchsize,
                "epoch": self._epoch, "minibatch": self._position, "real_steps": self.real_steps,
                "accumulated": self._accumulated() if self._position else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("rule") != self.rule:
            raise ValueError(f"a {state_dict.get('rule')!r} rule optimizer's state cannot be loaded into "
                             f"a {self.rule!r} one")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._epoch, self._position, self._calls = int(state_dict["epoch"]), int(state_dict["minibatch"]), None
        self.real_steps = int(state_dict["real_steps"])
        self.optimizer.zero_grad(set_to_none=True)
        if state_dict["accumulated"] is not None:
            self._restore_accumulated(state_dict["accumulated"])

    def _accumulated(self) -> Any:
        return [None if p.grad is None else p.grad.detach().clone() for p in self._params()]

    def _restore_accumulated(self, saved: Any) -> None:
        for p, g in zip(self._params(), saved, strict=True):
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype, copy=True)


class LinearRuleOptimizer(_RuleOptimizer):
    """Scales the LR by ``G/ref_batchsize`` for a step of ``G`` samples."""

    rule = "linear"

    def _factor(self, share: StepShare) -> float:
        return lr_factor("linear", share.samples, self.ref_batchsize)


class SqrtRuleOptimizer(_RuleOptimizer):
    """Scales the LR by ``sqrt(G/ref_batchsize)`` for a step of ``G`` samples."""

    rule = "sqrt"

    def _factor(self, share: StepShare) -> float:
        return lr_factor("sqrt", share.samples, self.ref_batchsize)


RootRuleOptimizer = SqrtRuleOptimizer  # the reference's name


class AdaScaleOptimizer(_RuleOptimizer):
    """Scales the LR by AdaScale's gain ratio, measured from the minibatches' gradients.

    ``gain = (σ²/ref + μ²) / (σ²/G + μ²)`` for a step of ``G`` samples against ``ref`` (1 at
    ``G == ref``; between 1 and ``G/ref``), with σ² and μ² estimated every step from the
    minibatch gradients of all ranks (:class:`flextrain.elastic.noise.GradientNoise`),
    each smoothed by a bias-corrected exponential moving average (``smoothing``), clipped at 0.
    A step of one minibatch in all (``m == 1``) keeps the previous estimates; before any, the gain
    is 1. :attr:`gain` is the last step's gain, :attr:`progress` the sum of gains (AdaScale's
    scale-invariant iterations). Needs one extra gradient-sized buffer.
    """

    rule = "adascale"

    def __init__(self, internal_optimizer: torch.optim.Optimizer, sampler: TraceBatchSampler,
                 ref_batchsize: int, log_steps: int | None = None, *, smoothing: float = 0.99) -> None:
        super().__init__(internal_optimizer, sampler, ref_batchsize, log_steps)
        self.noise = GradientNoise(smoothing=smoothing)
        if isinstance(sampler, AdaptiveBatchSampler) and sampler.noise is None:
            sampler.noise = self.noise  # the sampler's G follows the noise this optimizer measures
        self.smoothing = smoothing
        self.gain = 1.0
        self.progress = 0.0
        self._buffer: list[torch.Tensor | None] | None = None
        self._weighted_sqr = 0.0  # Σ n_i ‖g_i‖² of this rank's minibatches in the current step

    @property
    def variance(self) -> float | None:
        """The smoothed per-sample gradient variance σ² (None before any estimate)."""
        return self.noise.variance

    @property
    def sqr(self) -> float | None:
        """The smoothed squared norm of the true gradient μ² (None before any estimate)."""
        return self.noise.sqr

    def gain_for(self, samples: int) -> float:
        """The gain the current estimates give a step of ``samples``."""
        return self.noise.gain(samples, self.ref_batchsize)

    def _collect(self, size: int) -> None:
        # Each minibatch's gradient moves into the buffer (weighted by its size), leaving .grad
        # empty for the next one, so its norm is that minibatch's alone.
        params = list(self._params())
        if self._buffer is None:
            self._buffer = [None] * len(params)
        for k, p in enumerate(params):
            if p.grad is None:
                continue
            self._weighted_sqr += size * float(p.grad.detach().double().pow(2).sum())
            if self._buffer[k] is None:
                self._buffer[k] = p.grad.detach() * size
            else:
                self._buffer[k].add_(p.grad.detach(), alpha=size)
            p.grad = None

    def _accumulate(self, size: int, next_size: int) -> None:
        self._collect(size)

    def _drop_accumulation(self) -> None:
        super()._drop_accumulation()
        self._buffer, self._weighted_sqr = None, 0.0

    def _finish(self, share: StepShare, last_size: int | None) -> None:
        if last_size is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self._collect(last_size)
        for p, b in zip(self._params(), self._buffer or []):
            p.grad = None if b is None else b.div_(share.samples)
        extra = torch.tensor([self._weighted_sqr], dtype=torch.float64)
        self._buffer, self._weighted_sqr = None, 0.0
        self._all_reduce(extra)
        self._estimate(share, float(extra[0]))
        self.gain = self.gain_for(share.samples)
        self.progress += self.gain
        self._apply(share, self.gain)

    def _estimate(self, share: StepShare, weighted_sqr: float) -> None:
        if share.total_minibatches < 2:
            return  # (GradientNoise would ignore it too; this skips the norm)
        mean_sqr = sum(float(p.grad.detach().double().pow(2).sum()) for p in self._params() if p.grad is not None)
        self.noise.observe(micro_batches=share.total_minibatches, samples=share.samples,
                           weighted_sqr=weighted_sqr, mean_sqr=mean_sqr)

    def _log_extra(self) -> str:
        return f", gain {self.gain:.4g}, progress {self.progress:.6g}"

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["adascale"] = {"gain": self.gain, "progress": self.progress, **self.noise.state_dict()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        saved = state_dict["adascale"]
        self.gain, self.progress = float(saved["gain"]), float(saved["progress"])
        self.noise.load_state_dict(saved)

    def _accumulated(self) -> Any:
        return {"buffer": [None if b is None else b.clone() for b in self._buffer or []],
                "weighted_sqr": self._weighted_sqr}

    def _restore_accumulated(self, saved: Any) -> None:
        buffer = saved["buffer"]  # empty: saved at a step boundary
        self._buffer = [None if b is None else b.to(device=p.device, dtype=p.dtype, copy=True)
                        for p, b in zip(self._params(), buffer, strict=True)] if buffer else None
        self._weighted_sqr = float(saved["weighted_sqr"])


__all__ = ["AdaScaleOptimizer", "LinearRuleOptimizer", "RootRuleOptimizer", "SqrtRuleOptimizer"]
