"""Model backends: what the framework-neutral round protocol needs from PyTorch or Keras.

``AllReduceTrainer`` (``trainer.py``) owns the protocol: tasks, steps, the
planner's micro-batches, the control slots, the all-reduce, checkpoints. A
backend owns the model: it turns records into inputs (``feed``), accumulates
scaled gradients into flat buffers the collective reduces, applies the
optimizer from them, and moves model + optimizer state in and out as a tree
of torch tensors (``flextrain.elastic.statecodec`` encodes it, dtypes kept).

Buffers (:func:`gradient_buffers`): parameters may be float32, float64,
bfloat16 or float16, mixed in one model. Their gradients live in ONE flat
buffer per dtype, in the fixed order of :data:`FLOAT_DTYPES` (so the same on
every worker of the module), and each buffer is all-reduced in its own dtype:
a gradient is never cast, not even for the wire (gloo sums all four on CPU).
Only trainable floating-point parameters have a place; integer or bool
tensors and parameters with ``requires_grad=False`` are never reduced.

Control slots: the trainer's ``extra`` slots ride at the end of
``buffers[0]`` (float32 whenever the model has any), so a model of one dtype
costs one all-reduce per step, as before. They carry 0/1 flags that are only
ever compared with zero, and a sum of non-negative flags is zero exactly when
every flag is, in any float dtype.

Loss scaling (uneven splits): a micro-batch's loss is multiplied by
``size / G`` in the loss's own dtype before backward. In float32/float64 that
is as exact as the dtype; in bfloat16/float16 the factor is rounded like any
value of that dtype (exact when ``size / G`` has at most 8 / 11 significant
bits, e.g. every split of a power-of-two G up to 256 / 2048).

Implementations: ``flextrain.worker.pytorch.TorchBackend`` and
``flextrain.worker.tf.backend.KerasBackend``, made by :func:`flextrain.worker.frameworks.make_backend`
(this module imports neither).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import torch

from flextrain.worker.contract import FeedMetadata, Mode

# The dtypes a gradient buffer may have, in buffer order (float32 first: it carries the slots).
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def gradient_buffers(tensors: Sequence[tuple[torch.dtype, int]], extra: int):
    """``(buffers, views, slots)`` for gradients of the given ``(dtype, numel)``s, in that order.

    ``buffers``: one zeroed flat tensor per dtype present, ordered as :data:`FLOAT_DTYPES`
    (one float32 buffer when there is nothing at all); ``views[i]`` is the 1-D slice of its
    dtype's buffer that holds tensor ``i``; ``slots`` is the last ``extra`` elements of
    ``buffers[0]``. ValueError names a dtype that is not one of :data:`FLOAT_DTYPES`.
    """
    for dtype, _ in tensors:
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"got {dtype}; trainable parameters must be float32, float64, bfloat16 or float16")
    order = [d for d in FLOAT_DTYPES if any(dtype == d for dtype, _ in tensors)] or [torch.float32]
    sizes = dict.fromkeys(order, 0)
    offsets = []
    for dtype, numel in tensors:
        offsets.append(sizes[dtype])
        sizes[dtype] += numel
    sizes[order[0]] += extra
    buffers = [torch.zeros(sizes[d], dtype=d) for d in order]
    by_dtype = dict(zip(order, buffers))
    views = [by_dtype[dtype][o: o + numel] for (dtype, numel), o in zip(tensors, offsets)]
    return buffers, views, buffers[0][sizes[order[0]] - extra:]


def all_finite(tensors) -> bool:
    """No NaN or inf in ``tensors``. One float32 sum per tensor (a pass at memory speed) and one
    device-to-host read for all of them; only when a sum is not finite, which large finite values
    can also give, are the tensors checked element by element. (One tensor, the usual case of a
    model of one dtype: its sum is read and checked in Python, ~15 µs fewer than a stack and an
    ``isfinite`` on a CPU step.)"""
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return True
    if len(tensors) == 1:
        if math.isfinite(tensors[0].sum(dtype=torch.float32).item()):
            return True
    elif bool(torch.isfinite(torch.stack([t.sum(dtype=torch.float32) for t in tensors])).all()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def sqr_sum(tensors) -> float:
    """Σ‖t‖² over ``tensors`` (dense; None skipped), accumulated in float64, one host read."""
    norms = [torch.linalg.vector_norm(t, dtype=torch.float64) for t in tensors if t is not None and t.numel()]
    return float(torch.stack(norms).square().sum()) if norms else 0.0


class ModelBackend(ABC):
    """One model + optimizer, with gradients in per-dtype flat ``buffers`` (see the module docstring)."""

    buffers: list[torch.Tensor]  # one per dtype, FLOAT_DTYPES order; what the collective reduces
    slots: torch.Tensor          # the ``extra`` slots: a view of the end of ``buffers[0]``
    size: int                    # number of gradient elements, all dtypes together

    @abstractmethod
    def feed(self, records: Sequence[bytes], mode: Mode, meta: FeedMetadata) -> tuple[Any, Any]:
        """The module's ``feed``, checked: ``(features, labels)`` with first dimension ``len(records)``."""

    def prepare(self, sample: Callable[[], tuple[Any, Any]]) -> None:
        """Get ready for steps on inputs like ``sample()``'s ``(features, labels)`` (fed records), of any
        batch size, before the worker registers, changing no state; ``sample`` is called only if
        needed. Default: nothing to prepare (PyTorch runs eagerly). The caller treats an error as
        the loss of a head start, not of the job."""

    def traces(self) -> int | None:
        """How many times the step's functions were compiled so far (Keras: ``tf.function`` traces);
        None: nothing is compiled (the default: PyTorch runs eagerly)."""
        return None

    @abstractmethod
    def zero(self) -> None:
        """Start a step: no gradient accumulated yet, the extra slots zero."""

    @abstractmethod
    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        """Forward/backward over rows ``index``: gradients ``+= scale * d loss/d params``; returns the mean loss."""

    def gathered(self) -> None:
        """Make ``buffers`` hold the step's gradients (zero for parameters that got none),
        because they are about to be reduced. Not called when nothing is reduced (a world of one);
        default: ``buffers`` always hold them."""

    def overlap(self, cap: int) -> bool:
        """Reduce the gradients in buckets of about ``cap`` bytes, each as backward finishes it,
        from now on (``flextrain.worker.buckets``); False: this backend cannot (the default), or
        the model is one bucket (nothing could leave before backward ends): the trainer reduces
        ``buffers`` after backward. When True, a step goes :meth:`zero`, micro-batches
        (:meth:`arm` before the last one on this rank), :meth:`launch_buckets`, the slots set,
        :meth:`launch_tail` (the collective's works waited for), then as after :meth:`gathered`."""
        return False

    def arm(self, launch) -> None:
        """The next backward is this rank's last of the step: launch buckets as they complete."""
        raise NotImplementedError

    def launch_buckets(self, launch) -> None:
        """After the step's compute (whatever became of it): launch every bucket but the tail."""
        raise NotImplementedError

    def launch_tail(self, launch) -> None:
        """Launch the tail bucket with the slots (``launch`` keeps the work: the collective waits for it)."""
        raise NotImplementedError

    spoiled: bool = False  # a gradient changed after its bucket left: the step must be re-reduced flat

    def redo_flat(self) -> list[torch.Tensor]:
        """The local gradients back in ``buffers``; returns the parts to reduce again (no slots)."""
        raise NotImplementedError

    @abstractmethod
    def apply(self) -> None:
        """One optimizer step: with the reduced gradients in ``buffers`` after :meth:`gathered`,
        else with the gradients accumulated since :meth:`zero`."""

    def finite(self) -> bool:
        """Whether every gradient of the step is finite (reduced ones after :meth:`gathered`);
        default: ``buffers`` always hold them."""
        return all_finite(self.buffers)

    @abstractmethod
    def state(self) -> dict:
        """``{"model": ..., "optimizer": ...}`` as trees of torch tensors (dtypes as in the model)."""

    def scale_lr(self, factor: float) -> list[float]:
        """Set the optimizer's learning rate(s) to ``factor`` times those it was built with (a job's
        --lr-rule, as the global batch changes); returns them. Default: unsupported, named as such."""
        raise NotImplementedError(f"--lr-rule is not supported for {type(self).__name__} models yet "
                                  "(PyTorch and Keras modules); use --lr-rule none")

    def measure_micro_batches(self) -> None:
        """From now on, keep :attr:`micro_sqr` (the ``adascale`` LR rule's input). Default:
        unsupported, named as such."""
        raise NotImplementedError(f"--lr-rule adascale is not supported for {type(self).__name__} models yet "
                                  "(PyTorch and Keras modules); use --lr-rule linear, sqrt or none")

    # After measure_micro_batches(): Σ n_i‖g_i‖² over the micro-batches accumulated since zero(), with
    # g_i the gradient of micro-batch i's mean loss and n_i its samples (a float64 scalar tensor).
    micro_sqr: torch.Tensor | None = None

    def grad_sqr(self) -> float:
        """‖g‖² of the step's gradient (the reduced one after :meth:`gathered`), summed in float64.
        Default: ``buffers`` always hold them (the extra slots are not part of it)."""
        parts = list(self.buffers)
        parts[0] = parts[0][: parts[0].numel() - self.slots.numel()]
        return sqr_sum(parts)

    # The job's --lr was given: load_state keeps the learning rate the optimizer was built with
    # (a checkpoint's would undo a learning rate changed on --resume).
    keep_lr: bool = False

    @abstractmethod
    def load_state(self, tree: dict) -> None:
        """Load what :meth:`state` returned (on any worker of the same module); with
        :attr:`keep_lr` the optimizer keeps its learning rate(s) as built."""
