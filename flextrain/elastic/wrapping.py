"""The base of flextrain's optimizer wrappers: an optimizer that is another one, in place.

The GA wrapper (:class:`flextrain.elastic.torch.Optimizer`) and the rule
optimizers (:mod:`flextrain.elastic.rules`) decide *when* the user's optimizer
steps and with which gradient and learning rate, but never own parameters or
state: ``param_groups``, ``state`` and ``defaults`` are the inner optimizer's
own objects (Adam's moments survive the wrap; a scheduler attached to either
object sees the same groups), and any other attribute is the inner one's.
It subclasses ``torch.optim.Optimizer`` so LR schedulers accept it, without
calling its ``__init__``.
"""

from __future__ import annotations

from typing import Any

import torch


class WrappedOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizer: torch.optim.Optimizer, *, argument: str = "optimizer") -> None:
        # No super().__init__(): param_groups, state and defaults stay the inner optimizer's.
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{argument} must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, WrappedOptimizer):
            raise TypeError(f"{argument} is already wrapped by {type(optimizer).__name__}: wrap the plain optimizer")
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks; __dict__ directly: no recursion before __init__.
        inner = self.__dict__.get("optimizer")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


__all__ = ["WrappedOptimizer"]
