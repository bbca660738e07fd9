"""Precision: ``amp_native`` (autocast), ``half`` (fp16/bf16 weights) and ``tf32`` (CUDA matmuls).

``amp_native``: config ``{"dtype": "bf16"|"fp16"|torch dtype, "skip_if_nonfinite": bool}`` (ATorch's
code) or the documented shorthand ``"bf16"``/``"fp16"``; None is ATorch's default, fp16. The
outermost forward runs under ``torch.autocast`` (:class:`flextrain.accelerate.patches.AutocastForward`)
and so does the returned ``loss_func``; the user's loop does not change. fp16 adds a GradScaler
(``ShardedGradScaler`` under a sharding method) folded into the returned optimizer
(:class:`AmpOptimizer`) and into the loss's backward (:class:`_ScaleGrad`): ``loss.backward()``
produces scaled gradients while ``loss`` itself keeps its true value, and ``optim.step()``
unscales, skips a step whose gradients are not finite and updates the scale. bf16 needs no
scaling; with ``skip_if_nonfinite`` its steps with non-finite gradients are skipped too. On CUDA
without bf16 support, bf16 falls back to fp16 (as ATorch), with a note.

``half``: ``"fp16"`` (default) or ``"bf16"``: the model's floating-point weights cast, and every
floating-point tensor of a prepared batch cast to match.

``tf32``: TF32 matmuls and convolutions on CUDA devices of compute capability 8.0 or more.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from flextrain.accelerate.data import loss_of, map_tensors
from flextrain.accelerate.methods.base import HALF_DTYPES, Method, Phase, half_dtype_name
from flextrain.accelerate.methods.registry import register
from flextrain.accelerate.patches import AutocastForward
from flextrain.elastic.wrapping import WrappedOptimizer


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by the scaler's current scale."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, scaler: Any) -> torch.Tensor:
        ctx.scaler = scaler
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.scaler.scale(grad), None


class AmpOptimizer(WrappedOptimizer):
    """The user's optimizer with amp's step: unscale + skip non-finite + update the scale (fp16), or
    skip steps with non-finite gradients (bf16 with ``skip_if_nonfinite``). ``state_dict`` is the
    inner optimizer's; the scaler is :attr:`grad_scaler` (save its ``state_dict`` alongside)."""

    def __init__(self, optimizer: torch.optim.Optimizer, grad_scaler: Any = None, *,
                 skip_if_nonfinite: bool = False) -> None:
        super().__init__(optimizer, argument="optim_func's optimizer")
        self.grad_scaler, self.skip_if_nonfinite = grad_scaler, skip_if_nonfinite
        self.step_was_skipped = False

    def step(self, closure: Any = None) -> Any:
        if self.grad_scaler is not None:
            if closure is not None:
                raise ValueError("amp_native with fp16 cannot step with a closure (torch's GradScaler has no closure)")
            before = self.grad_scaler.get_scale()
            result = self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
            self.step_was_skipped = self.grad_scaler.get_scale() < before
            return result
        if self.skip_if_nonfinite and not self._grads_finite():
            self.step_was_skipped = True
            return None
        self.step_was_skipped = False
        return self.optimizer.step(closure)

    def _grads_finite(self) -> bool:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        bad = torch.zeros((), dtype=torch.float32, device=grads[0].device if grads else "cpu")
        for g in grads:
            local = g.to_local() if hasattr(g, "to_local") else g
            bad = torch.maximum(bad, (~torch.isfinite(local)).any().float().to(bad.device))
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # sharded gradients: every process decides alike
        return not bool(bad)

    def unscale_(self) -> None:
        """Unscale the gradients in place before the step (for gradient clipping); fp16 only."""
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"AmpOptimizer(scaler={self.grad_scaler is not None}, {self.optimizer!r})"


class _AmpLoss:
    """The user's loss_func under autocast, its loss scaled in the backward pass when a scaler is set."""

    def __init__(self, loss_func: Any, device_type: str, dtype: torch.dtype, scaler: Any) -> None:
        self.loss_func, self.device_type, self.dtype, self.scaler = loss_func, device_type, dtype, scaler

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            result = self.loss_func(*args, **kwargs)
        if self.scaler is None:
            return result
        scaled = _ScaleGrad.apply(loss_of(result), self.scaler)
        if hasattr(result, "_fields"):  # a named tuple
            return result._replace(**{result._fields[0]: scaled})
        if isinstance(result, list | tuple):
            return type(result)([scaled, *result[1:]])
        return scaled


def _search_dtypes(device: torch.device) -> tuple[str, ...]:
    """The half dtypes the automatic search tries: bf16 (where the device has it) and fp16 on CUDA;
    bf16 alone on the CPU, whose fp16 kernels are few and slow."""
    if device.type == "cuda":
        return ("bf16", "fp16") if torch.cuda.is_bf16_supported() else ("fp16",)
    return ("bf16",)


def _grad_scaler(ctx: Any) -> Any:
    if ctx.sharded_by is not None:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=ctx.device.type)
    return torch.amp.GradScaler(ctx.device.type)


@register
class AmpNative(Method):
    name, phase, group = "amp_native", Phase.AUTOCAST, "precision"
    summary = "automatic mixed precision: autocast (bf16/fp16) around forward and loss; fp16 loss scaling"

    def validate(self, config: Any) -> Any:
        if config is None or isinstance(config, str | torch.dtype):
            dtype, skip = half_dtype_name(self, config or "fp16", config), None
        else:
            cfg = self.dict_config(config, {"dtype": None, "skip_if_nonfinite": None, "enabled": None})
            if cfg.pop("enabled", True) is not True:
                raise self.config_error(config, "sets enabled to something other than True (leave amp_native out)")
            dtype = half_dtype_name(self, cfg.get("dtype", "fp16"), config)
            skip = cfg.get("skip_if_nonfinite")
            if skip is not None and not isinstance(skip, bool):
                raise self.config_error(config, "skip_if_nonfinite must be True or False")
        # fp16's GradScaler always skips steps with non-finite gradients.
        return {"dtype": dtype, "skip_if_nonfinite": True if dtype == "fp16" else bool(skip)}

    def loss_tolerance(self, config: Any) -> float:
        return 0.05 if config["dtype"] == "bf16" else 0.02

    def neighbours(self, config: Any) -> tuple[Any, ...]:
        other = "fp16" if config["dtype"] == "bf16" else "bf16"
        return (self.validate({"dtype": other, "skip_if_nonfinite": config["skip_if_nonfinite"]}),)

    def candidates(self, model: torch.nn.Module, device: torch.device, world: Any) -> tuple[Any, ...]:
        return tuple(self.validate(d) for d in _search_dtypes(device))

    def apply(self, ctx: Any, config: Any) -> None:
        name = config["dtype"]
        if name == "bf16" and ctx.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            name = "fp16"
            ctx.note("amp_native: this CUDA device has no bf16, fp16 used instead")
            ctx.effective[self.name] = self.validate({"dtype": "fp16"})
        dtype, device_type = HALF_DTYPES[name], ctx.device.type
        AutocastForward.install(ctx.model, device_type, dtype)
        inputs = ctx.inputs
        scaler = None
        if name == "fp16":
            if inputs.optim_func is None or inputs.loss_func is None:
                ctx.note("amp_native: fp16 without loss scaling (it needs both optim_func and loss_func)")
            else:
                scaler = _grad_scaler(ctx)
        ctx.loss_wrappers.append(lambda f: _AmpLoss(f, device_type, dtype, scaler))
        skip = config["skip_if_nonfinite"]
        if scaler is not None or skip:
            ctx.optimizer_wrappers.append(lambda opt: AmpOptimizer(opt, scaler, skip_if_nonfinite=skip))


@register
class Half(Method):
    name, phase, group = "half", Phase.CAST, "precision"
    summary = "half-precision training: weights and floating-point inputs in fp16 or bf16"

    def validate(self, config: Any) -> Any:
        return half_dtype_name(self, "fp16" if config is None else config, config)

    def loss_tolerance(self, config: Any) -> float:
        return 0.1 if config == "bf16" else 0.05

    def neighbours(self, config: Any) -> tuple[Any, ...]:
        return ("fp16" if config == "bf16" else "bf16",)

    def candidates(self, model: torch.nn.Module, device: torch.device, world: Any) -> tuple[Any, ...]:
        return _search_dtypes(device)

    def apply(self, ctx: Any, config: Any) -> None:
        dtype = HALF_DTYPES[config]
        ctx.model.to(dtype)
        ctx.input_casts.append(lambda data: map_tensors(data, lambda t: t.to(dtype) if t.is_floating_point() else t))


@register
class TF32(Method):
    name, phase = "tf32", Phase.CAST
    loss_rtol = 0.01
    summary = "TF32 matmuls and convolutions (CUDA, compute capability >= 8.0)"

    def check(self, model: torch.nn.Module, device: torch.device, world: Any, config: Any = None) -> str | None:
        if device.type != "cuda":
            return f"TF32 is a CUDA tensor-core format; the device is {device.type}"
        if torch.cuda.get_device_capability(device) < (8, 0):
            return "TF32 needs a CUDA device of compute capability 8.0 or more"
        return None

    def apply(self, ctx: Any, config: Any) -> None:
        before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

        def restore() -> None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        ctx.on_restore(restore)


__all__ = ["AmpNative", "AmpOptimizer", "Half", "TF32"]
