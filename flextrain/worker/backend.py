"""Model backends: what the framework-neutral round protocol needs from PyTorch or Keras.

``AllReduceTrainer`` (``trainer.py``) owns the protocol: tasks, steps, the
planner's micro-batches, the control slots, the all-reduce, checkpoints. A
backend owns the model: it turns records into inputs (``feed``), accumulates
scaled gradients into the flat float32 buffer the collective reduces,
applies the optimizer from it, and moves model + optimizer state in and out
as a tree of torch tensors (``flextrain.elastic.statecodec`` encodes it).

The buffer is ``[gradients of every trainable parameter..., extra slots]``;
the trainer uses the extra slots for its control flags.

Implementations: :class:`TorchBackend` here, ``flextrain.worker.tf.backend.KerasBackend``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

from flextrain.worker.module import FeedMetadata, Framework, Mode, ModelDef, ModelDefError


class ModelBackend(ABC):
    """One model + optimizer, with gradients in ``flat[:size]``."""

    flat: torch.Tensor  # float32, gradients then ``extra`` slots
    size: int           # number of gradient elements

    @abstractmethod
    def feed(self, records: Sequence[bytes], mode: Mode, meta: FeedMetadata) -> tuple[Any, Any]:
        """The module's ``feed``, checked: ``(features, labels)`` with first dimension ``len(records)``."""

    @abstractmethod
    def zero(self) -> None:
        """Start a step: no gradient accumulated yet, the extra slots zero."""

    @abstractmethod
    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        """Forward/backward over rows ``index``: ``flat += scale * d loss/d params``; returns the mean loss."""

    def gathered(self) -> None:
        """Make ``flat[:size]`` hold the step's gradients (zero for parameters that got none),
        because it is about to be reduced. Not called when nothing is reduced (a world of one);
        default: ``flat`` always holds them."""

    @abstractmethod
    def apply(self) -> None:
        """One optimizer step: with the reduced gradients in ``flat`` after :meth:`gathered`,
        else with the gradients accumulated since :meth:`zero`."""

    @abstractmethod
    def state(self) -> dict:
        """``{"model": ..., "optimizer": ...}`` as trees of torch tensors."""

    @abstractmethod
    def load_state(self, tree: dict) -> None:
        """Load what :meth:`state` returned (on any worker of the same module)."""


class TorchBackend(ModelBackend):
    """``torch.nn.Module`` + ``torch.optim``; ``p.grad`` becomes a view into ``flat`` when reduced.

    Like ``optimizer.zero_grad(set_to_none=True)`` in a plain loop, a step starts without
    gradients, so its first backward writes fresh ones: zeroing the buffer and adding into
    it would cost two passes over every gradient per step. :meth:`gathered` copies them into
    ``flat`` only when a reduction needs them there (one pass); a lone worker never copies.
    """

    def __init__(self, *, model_def: ModelDef, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: int) -> None:
        self.model_def, self.model, self.optimizer = model_def, model, optimizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.size = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(self.size + extra, dtype=torch.float32)
        offset = 0
        self._views = []
        for p in self.params:
            if p.dtype != self.flat.dtype:
                raise ModelDefError(f"{model_def.path}: parameters must be float32, got {p.dtype}")
            self._views.append(self.flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()

    def feed(self, records, mode, meta):
        from flextrain.worker.trainer import feed_tensors

        return feed_tensors(self.model_def, records, mode, meta)

    def zero(self) -> None:
        for p in self.params:
            p.grad = None
        self.flat[self.size:].zero_()

    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        from flextrain.worker.trainer import take

        self.model.train()
        loss = self.model_def.loss(take(labels, index), self.model(take(features, index)))
        (loss if scale == 1.0 else loss * scale).backward()
        return float(loss.detach())

    def gathered(self) -> None:
        for p, view in zip(self.params, self._views):
            self._bind(p, view)

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
        self.optimizer.load_state_dict(tree["optimizer"])
        self.zero()


def make_backend(*, model_def: ModelDef, model, optimizer, extra: int) -> ModelBackend:
    """The backend for the module's framework."""
    if model_def.framework is Framework.TENSORFLOW:
        from flextrain.worker.tf.backend import KerasBackend

        return KerasBackend(model_def=model_def, model=model, optimizer=optimizer, extra=extra)
    return TorchBackend(model_def=model_def, model=model, optimizer=optimizer, extra=extra)
