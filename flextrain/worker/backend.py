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
        """Gradients to zero (the extra slots too)."""

    @abstractmethod
    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        """Forward/backward over rows ``index``: ``flat += scale * d loss/d params``; returns the mean loss."""

    def gathered(self) -> None:
        """Make sure ``flat`` holds the gradients before it is reduced (default: it always does)."""

    @abstractmethod
    def apply(self) -> None:
        """One optimizer step with the (reduced) gradients in ``flat``."""

    @abstractmethod
    def state(self) -> dict:
        """``{"model": ..., "optimizer": ...}`` as trees of torch tensors."""

    @abstractmethod
    def load_state(self, tree: dict) -> None:
        """Load what :meth:`state` returned (on any worker of the same module)."""


class TorchBackend(ModelBackend):
    """``torch.nn.Module`` + ``torch.optim``: every ``p.grad`` is a view into ``flat``."""

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
            view = self.flat[offset: offset + p.numel()].view_as(p)
            p.grad = view
            self._views.append(view)
            offset += p.numel()

    def feed(self, records, mode, meta):
        from flextrain.worker.trainer import feed_tensors

        return feed_tensors(self.model_def, records, mode, meta)

    def zero(self) -> None:
        self.flat.zero_()
        for p, view in zip(self.params, self._views):
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view  # someone replaced the grad tensor: re-bind it

    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        from flextrain.worker.trainer import take

        self.model.train()
        loss = self.model_def.loss(take(labels, index), self.model(take(features, index)))
        (loss * scale).backward()
        return float(loss.detach())

    def gathered(self) -> None:
        for p, view in zip(self.params, self._views):
            if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
                p.grad = view

    def apply(self) -> None:
        self.optimizer.step()

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
