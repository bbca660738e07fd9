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

Implementations: :class:`TorchBackend` here, ``flextrain.worker.tf.backend.KerasBackend``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

from flextrain.worker.module import FeedMetadata, Framework, Mode, ModelDef, ModelDefError

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
    can also give, are the tensors checked element by element."""
    tensors = [t for t in tensors if t.numel()]
    if not tensors or bool(torch.isfinite(torch.stack([t.sum(dtype=torch.float32) for t in tensors])).all()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


class ModelBackend(ABC):
    """One model + optimizer, with gradients in per-dtype flat ``buffers`` (see the module docstring)."""

    buffers: list[torch.Tensor]  # one per dtype, FLOAT_DTYPES order; what the collective reduces
    slots: torch.Tensor          # the ``extra`` slots: a view of the end of ``buffers[0]``
    size: int                    # number of gradient elements, all dtypes together

    @abstractmethod
    def feed(self, records: Sequence[bytes], mode: Mode, meta: FeedMetadata) -> tuple[Any, Any]:
        """The module's ``feed``, checked: ``(features, labels)`` with first dimension ``len(records)``."""

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

    # The job's --lr was given: load_state keeps the learning rate the optimizer was built with
    # (a checkpoint's would undo a learning rate changed on --resume).
    keep_lr: bool = False

    @abstractmethod
    def load_state(self, tree: dict) -> None:
        """Load what :meth:`state` returned (on any worker of the same module); with
        :attr:`keep_lr` the optimizer keeps its learning rate(s) as built."""


class TorchBackend(ModelBackend):
    """``torch.nn.Module`` + ``torch.optim``; ``p.grad`` becomes a view into its dtype's buffer when reduced.

    Like ``optimizer.zero_grad(set_to_none=True)`` in a plain loop, a step starts without
    gradients, so its first backward writes fresh ones: zeroing the buffers and adding into
    them would cost two passes over every gradient per step. :meth:`gathered` copies them into
    the buffers only when a reduction needs them there (one pass); a lone worker never copies.
    """

    def __init__(self, *, model_def: ModelDef, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: int) -> None:
        self.model_def, self.model, self.optimizer = model_def, model, optimizer
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for name, p in named:
            if p.dtype not in FLOAT_DTYPES:
                raise ModelDefError(f"{model_def.path}: parameter {name!r} is {p.dtype}; trainable parameters "
                                    "must be float32, float64, bfloat16 or float16")
        self.params = [p for _, p in named]
        self.size = sum(p.numel() for p in self.params)
        self.buffers, views, self.slots = gradient_buffers([(p.dtype, p.numel()) for p in self.params], extra)
        self._views = [view.view_as(p) for p, view in zip(self.params, views)]
        self._gathered = False  # the step's gradients are in the buffers (not only in p.grad)

    def feed(self, records, mode, meta):
        from flextrain.worker.trainer import feed_tensors

        return feed_tensors(self.model_def, records, mode, meta)

    def zero(self) -> None:
        for p in self.params:
            p.grad = None
        self.slots.zero_()
        self._gathered = False

    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        from flextrain.worker.trainer import take

        self.model.train()
        loss = check_loss(self.model_def, self.model_def.loss(take(labels, index), self.model(take(features, index))),
                          samples=index.stop - index.start)
        (loss if scale == 1.0 else loss * scale).backward()
        return float(loss.detach())

    def finite(self) -> bool:
        if self._gathered:
            return all_finite(self.buffers)
        return all_finite(g._values() if g.is_sparse else g for p in self.params if (g := p.grad) is not None)

    def gathered(self) -> None:
        for p, view in zip(self.params, self._views):
            self._bind(p, view)
        self._gathered = True

    def apply(self) -> None:
        for p, view in zip(self.params, self._views):
            if p.grad is None or p.grad.is_sparse:  # as if gathered, whatever the world size:
                self._bind(p, view)  # untouched parameters get a zero gradient, sparse ones a dense one
        self.optimizer.step()

    @staticmethod
    def _bind(p: torch.Tensor, view: torch.Tensor) -> None:
        """Make ``view`` hold ``p``'s gradient (zero if none, dense if sparse) and ``p.grad`` it."""
        grad = p.grad
        if grad is None:
            view.zero_()
        elif grad.is_sparse:  # nn.Embedding(sparse=True): optimizers and reductions get it dense
            view.zero_().add_(grad)
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)
        p.grad = view

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, tree: dict) -> None:
        self.model.load_state_dict(tree["model"])
        built = [group["lr"] for group in self.optimizer.param_groups]  # per group, as the module set them
        self.optimizer.load_state_dict(tree["optimizer"])
        if self.keep_lr:
            for group, lr in zip(self.optimizer.param_groups, built):
                group["lr"] = lr
        self.zero()


def check_loss(model_def: ModelDef, loss, *, samples: int):
    """The module's loss as the contract wants it: a scalar tensor that requires grad (ModelDefError else)."""
    call = "loss(labels, predictions)"
    if not isinstance(loss, torch.Tensor):
        raise ModelDefError(f"{model_def.path}: {call} returned {type(loss).__name__}, expected a scalar "
                            "torch.Tensor (the mean loss over the samples)")
    if loss.numel() != 1:
        raise ModelDefError(f"{model_def.path}: {call} returned a tensor of shape {tuple(loss.shape)} for {samples} "
                            "samples; it must return the mean over the samples, a scalar (e.g. end with .mean())")
    if not loss.requires_grad:
        raise ModelDefError(f"{model_def.path}: {call} returned a tensor that does not require grad, so no gradient "
                            "reaches the model's parameters (a constant, or computed under torch.no_grad(), "
                            "with .detach(), .item() or numpy?)")
    return loss


def make_backend(*, model_def: ModelDef, model, optimizer, extra: int, keep_lr: bool = False) -> ModelBackend:
    """The backend for the module's framework. ``keep_lr``: the job's ``--lr`` was given, so the
    optimizer's learning rate as built stays when a state is loaded (a resume may change it)."""
    if model_def.framework is Framework.TENSORFLOW:
        from flextrain.worker.tf.backend import KerasBackend

        backend = KerasBackend(model_def=model_def, model=model, optimizer=optimizer, extra=extra)
    else:
        backend = TorchBackend(model_def=model_def, model=model, optimizer=optimizer, extra=extra)
    backend.keep_lr = keep_lr
    return backend
