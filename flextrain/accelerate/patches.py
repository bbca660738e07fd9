"""A module's ``forward`` changed in place, so that the user's loop and ``state_dict`` keys stay as they were.

``amp_native`` runs the outermost forward under autocast and ``checkpoint`` recomputes chosen
submodules in the backward pass. Both replace ``module.forward`` by an instance attribute, as
ATorch does, rather than wrapping the module in another one (which would prefix every
``state_dict`` key). The replacement is a small object, not a closure, so that ``copy.deepcopy``
and ``torch.save`` of the model keep working: it holds the module and the forward it replaced
(an earlier patch, or None for the class's own ``forward``), and both are copied with the model.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils.checkpoint


class ForwardPatch:
    """Base: ``install(module, ...)`` puts an instance in ``module.forward``; ``call_inner`` runs what
    it replaced."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.inner = module.__dict__.get("forward")  # an earlier patch (or user's function); None: the class's

    @classmethod
    def install(cls, module: torch.nn.Module, *args: Any, **kwargs: Any) -> ForwardPatch:
        patch = cls(module, *args, **kwargs)
        module.forward = patch
        return patch

    def call_inner(self, *args: Any, **kwargs: Any) -> Any:
        if self.inner is None:
            return type(self.module).forward(self.module, *args, **kwargs)
        return self.inner(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call_inner(*args, **kwargs)


def patches_of(module: torch.nn.Module) -> list[ForwardPatch]:
    """The patches installed on ``module``, outermost first."""
    out, f = [], module.__dict__.get("forward")
    while isinstance(f, ForwardPatch):
        out.append(f)
        f = f.inner
    return out


class AutocastForward(ForwardPatch):
    """The forward under ``torch.autocast(device_type, dtype)``."""

    def __init__(self, module: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__(module)
        self.device_type, self.dtype = device_type, dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.call_inner(*args, **kwargs)


class CheckpointForward(ForwardPatch):
    """The forward run by ``torch.utils.checkpoint.checkpoint``: its activations are not kept but
    recomputed in the backward pass. Without gradients (evaluation) it is the plain forward.
    The reentrant variant takes no tensor keyword arguments (torch's own limit)."""

    def __init__(self, module: torch.nn.Module, *, use_reentrant: bool) -> None:
        super().__init__(module)
        self.use_reentrant = use_reentrant

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.call_inner(*args, **kwargs)
        if not self.use_reentrant:
            return torch.utils.checkpoint.checkpoint(self.call_inner, *args, use_reentrant=False, **kwargs)
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise TypeError(f"checkpoint with no_reentrant=False cannot pass tensor keyword arguments to "
                            f"{type(self.module).__name__}.forward ({', '.join(kwargs)}): use no_reentrant=True")
        fn = functools.partial(self.call_inner, **kwargs) if kwargs else self.call_inner
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=True)


__all__ = ["AutocastForward", "CheckpointForward", "ForwardPatch", "patches_of"]
