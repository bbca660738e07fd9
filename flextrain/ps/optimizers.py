"""Optimizers run by the PS, numerically the same as ``torch.optim``'s CPU path.

One ``update`` serves dense tensors and embedding rows:

* dense: ``param``/``grad``/slots are (flat views of) whole tensors and
  ``step`` is a Python int, the tensor's step count after this update;
* sparse: they are the gathered rows of a table, ``[n, dim]``, and ``step``
  is an ``[n, 1]`` float64 tensor of per-row step counts. A row's optimizer
  state moves only when the row is pushed ("lazy" sparse semantics), so a row
  updated k times ends exactly where the dense optimizer would put a tensor
  made of that row after the same k gradients; untouched rows never change.

Hyperparameter names follow torch.optim (``betas`` may be given as
``beta1``/``beta2`` since the wire carries a map of doubles). An unknown
optimizer or hyperparameter name is a ``ValueError`` listing the known ones.
"""

from __future__ import annotations

from typing import Mapping

import torch

Step = int | torch.Tensor


def _as_param_dtype(value, like: torch.Tensor):
    """Per-row coefficients come as float64 tensors; cast once to the param dtype."""
    return value.to(like.dtype) if isinstance(value, torch.Tensor) else value


class Optimizer:
    """Base class: subclasses set ``name``, ``defaults`` and implement ``slots``/``update``."""

    name = ""
    defaults: dict[str, float] = {}

    def __init__(self, hyper: Mapping[str, float] | None = None) -> None:
        hyper = dict(hyper or {})
        if "betas" in hyper:  # torch spelling; the wire spells it beta1/beta2
            hyper["beta1"], hyper["beta2"] = hyper.pop("betas")
        unknown = sorted(set(hyper) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"optimizer {self.name!r} has no hyperparameter(s) {', '.join(unknown)}; "
                f"it takes: {', '.join(sorted(self.defaults))}"
            )
        self.hyper = {key: float(hyper.get(key, default)) for key, default in self.defaults.items()}
        for key, value in self.hyper.items():
            if value != value or value < 0:  # NaN or negative: never meaningful here
                raise ValueError(f"optimizer {self.name!r}: {key} must be a number >= 0, got {value}")
        self.validate()

    def validate(self) -> None:
        """Raise ValueError for out-of-range hyperparameters."""

    def slots(self) -> dict[str, float]:
        """State tensors shaped like the parameter, by name, with their initial value."""
        return {}

    @property
    def needs_step(self) -> bool:
        """Whether ``update`` depends on the step count (else sparse updates may pass ``step=None``)."""
        return True

    def plain_lr(self) -> float | None:
        """The lr if an update is exactly ``param -= lr * grad`` (no state at all), else None."""
        return None

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Mapping[str, torch.Tensor],
               step: Step | None, lr_scale: float = 1.0) -> None:
        """Apply one step in place to ``param`` and ``state`` (``grad`` is not modified)."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v:g}' for k, v in sorted(self.hyper.items()))})"


class SGD(Optimizer):
    """torch.optim.SGD: weight decay (L2), momentum with dampening, Nesterov."""

    name = "sgd"
    defaults = {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": 0.0}

    def validate(self) -> None:
        if self.hyper["nesterov"] and (self.hyper["momentum"] <= 0 or self.hyper["dampening"] != 0):
            raise ValueError(f"optimizer {self.name!r}: nesterov needs momentum > 0 and dampening 0")

    def slots(self) -> dict[str, float]:
        return {"momentum_buffer": 0.0} if self.hyper["momentum"] else {}

    @property
    def needs_step(self) -> bool:
        # torch starts the buffer at the first gradient; from a zero buffer that only differs with dampening.
        return bool(self.hyper["momentum"] and self.hyper["dampening"])

    def plain_lr(self) -> float | None:
        return self.hyper["lr"] if not self.hyper["momentum"] and not self.hyper["weight_decay"] else None

    def update(self, param, grad, state, step, lr_scale=1.0):
        h = self.hyper
        if h["weight_decay"]:
            grad = grad.add(param, alpha=h["weight_decay"])
        momentum = h["momentum"]
        if momentum:
            buf = state["momentum_buffer"]
            if step is None:  # see needs_step: the zero buffer makes the first step come out right
                buf.mul_(momentum).add_(grad)
            elif isinstance(step, torch.Tensor):
                # torch starts the buffer at the first gradient (no dampening then).
                later = buf * momentum + grad * (1 - h["dampening"])
                buf.copy_(torch.where(step == 1, grad, later))
            elif step == 1:
                buf.copy_(grad)
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - h["dampening"])
            grad = grad.add(buf, alpha=momentum) if h["nesterov"] else buf
        param.add_(grad, alpha=-h["lr"] * lr_scale)


class Momentum(SGD):
    """SGD with momentum 0.9 unless given."""

    name = "momentum"
    defaults = {**SGD.defaults, "momentum": 0.9}


class Adam(Optimizer):
    """torch.optim.Adam (L2 weight decay folded into the gradient), optional AMSGrad."""

    name = "adam"
    defaults = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "amsgrad": 0.0}
    decoupled = False

    def validate(self) -> None:
        for key in ("beta1", "beta2"):
            if not 0 <= self.hyper[key] < 1:
                raise ValueError(f"optimizer {self.name!r}: {key} must be in [0, 1), got {self.hyper[key]}")

    def slots(self) -> dict[str, float]:
        names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if self.hyper["amsgrad"] else [])
        return dict.fromkeys(names, 0.0)

    def update(self, param, grad, state, step, lr_scale=1.0):
        h = self.hyper
        lr, beta1, beta2 = h["lr"] * lr_scale, h["beta1"], h["beta2"]
        if h["weight_decay"]:
            if self.decoupled:
                param.mul_(1 - lr * h["weight_decay"])
            else:
                grad = grad.add(param, alpha=h["weight_decay"])
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if isinstance(step, torch.Tensor):
            bias_correction1 = 1 - torch.pow(beta1, step)
            bias_correction2_sqrt = (1 - torch.pow(beta2, step)).sqrt()
        else:
            bias_correction1 = 1 - beta1 ** step
            bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        second = exp_avg_sq
        if h["amsgrad"]:
            torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
            second = state["max_exp_avg_sq"]
        denom = (second.sqrt() / _as_param_dtype(bias_correction2_sqrt, param)).add_(h["eps"])
        step_size = lr / bias_correction1
        if isinstance(step_size, torch.Tensor):
            param.sub_(exp_avg / denom * step_size.to(param.dtype))
        else:
            param.addcdiv_(exp_avg, denom, value=-step_size)


class AdamW(Adam):
    """torch.optim.AdamW: decoupled weight decay (default 0.01)."""

    name = "adamw"
    defaults = {**Adam.defaults, "weight_decay": 1e-2}
    decoupled = True


class Adagrad(Optimizer):
    """torch.optim.Adagrad with lr_decay and initial_accumulator_value."""

    name = "adagrad"
    defaults = {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10}

    def slots(self) -> dict[str, float]:
        return {"sum": self.hyper["initial_accumulator_value"]}

    def update(self, param, grad, state, step, lr_scale=1.0):
        h = self.hyper
        if h["weight_decay"]:
            grad = grad.add(param, alpha=h["weight_decay"])
        clr = h["lr"] * lr_scale / (1 + (step - 1) * h["lr_decay"])
        state_sum = state["sum"]
        state_sum.addcmul_(grad, grad, value=1)
        std = state_sum.sqrt().add_(h["eps"])
        if isinstance(clr, torch.Tensor):
            param.sub_(grad / std * clr.to(param.dtype))
        else:
            param.addcdiv_(grad, std, value=-clr)


OPTIMIZERS: dict[str, type[Optimizer]] = {cls.name: cls for cls in (SGD, Momentum, Adam, AdamW, Adagrad)}


def make_optimizer(name: str, hyper: Mapping[str, float] | None = None) -> Optimizer:
    """The optimizer called ``name`` (case-insensitive) with ``hyper`` over its defaults."""
    cls = OPTIMIZERS.get(name.strip().lower())
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r} on the parameter server; known: {', '.join(sorted(OPTIMIZERS))}")
    return cls(hyper)
