"""The counter of learnable parameters: :func:`summary` of a model, per module and in bytes.

Parameters per module that owns them (count, trainable, dtypes, bytes), the bytes of
gradients, buffers and optimizer state (measured when the state exists, estimated from the
optimizer's kind before its first step), and, given an input, the forward+backward peak per
micro-batch size (:func:`flextrain.elastic.memory.step_peak`'s accounting). ``str()`` of the
result is a table; ``as_dict()`` is JSON-able. The summary changes neither parameters nor
gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from torch.utils._pytree import tree_leaves

from flextrain.elastic.memory import (_device, _fork_rng, _measure, _model_device, _optimizer_tensors, _storage_bytes,
                                      _tensor_bytes, format_bytes)

@dataclass(frozen=True)
class ModuleRow:
    name: str  # as named_modules() names it; "" is the model itself
    type: str
    parameters: int
    trainable: int
    dtypes: tuple[str, ...]
    bytes: int


@dataclass(frozen=True)
class ModelSummary:
    """What a model holds and a training step adds, in elements and bytes (:func:`summary`)."""

    modules: tuple[ModuleRow, ...]
    parameters: int
    trainable: int
    parameter_bytes: int
    gradient_bytes: int  # what .grad of the trainable parameters holds after a backward
    buffer_bytes: int
    optimizer_state_bytes: int | None  # None: no optimizer, or no estimate (see notes)
    activation_peaks: tuple[tuple[int, int], ...]  # (micro-batch size, forward+backward bytes above static)
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["modules"] = [{**row, "dtypes": list(row["dtypes"])} for row in data["modules"]]
        data["activation_peaks"] = [list(pair) for pair in self.activation_peaks]
        data["notes"] = list(self.notes)
        return data

    def __str__(self) -> str:
        header = ("module", "type", "params", "trainable", "dtype", "size")
        rows = [(r.name or "(model)", r.type, f"{r.parameters:,}", f"{r.trainable:,}", ",".join(r.dtypes),
                 format_bytes(r.bytes)) for r in self.modules]
        widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header))]
        right = {2, 3, 5}

        def line(cells: tuple[str, ...]) -> str:
            return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

        out = [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
        out.append(f"parameters: {self.parameters:,} ({self.trainable:,} trainable, "
                   f"{self.parameters - self.trainable:,} frozen)")
        out.append(f"parameter bytes: {format_bytes(self.parameter_bytes)}; gradients: "
                   f"{format_bytes(self.gradient_bytes)}; buffers: {format_bytes(self.buffer_bytes)}")
        if self.optimizer_state_bytes is not None:
            out.append(f"optimizer state: {format_bytes(self.optimizer_state_bytes)}")
        for size, nbytes in self.activation_peaks:
            out.append(f"forward+backward, micro-batch {size}: {format_bytes(nbytes)} above the static bytes")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def _state_copies(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> tuple[int, bool] | None:
    """What ``optimizer``'s first step creates per trainable parameter of ``group``: (copies of
    the parameter, whether a scalar step count too); None for a class without an estimate."""
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):  # AdamW is an Adam since torch 2.6
        return 2 + bool(group.get("amsgrad")), True
    if isinstance(optimizer, torch.optim.SGD):
        return int(group.get("momentum", 0) != 0), False
    if isinstance(optimizer, torch.optim.RMSprop):
        return 1 + bool(group.get("centered")) + (group.get("momentum", 0) != 0), True
    if isinstance(optimizer, torch.optim.Adagrad):
        return 1, True
    return None


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> tuple[int | None, str | None]:
    """(bytes, note): measured when the optimizer has state, else estimated (with a note saying so)."""
    if optimizer.state:
        return _storage_bytes(_optimizer_tensors(optimizer)), None
    name = type(optimizer).__name__
    scalar = torch.empty((), dtype=torch.get_default_dtype(), device="meta").element_size()  # Adam's step
    estimate, copies, counts = 0, set(), False
    for group in optimizer.param_groups:
        per = _state_copies(optimizer, group)
        if per is None:
            return None, (f"{name} has no state yet (it is created by its first step) and no estimate is known "
                          "for it: take one step and summarise again to measure it")
        params = [p for p in group["params"] if p.requires_grad]
        estimate += per[0] * _tensor_bytes(params) + (len(params) * scalar if per[1] else 0)
        copies.add(per[0])
        counts |= per[1]
    return estimate, (f"optimizer state estimated: {name} has taken no step yet; its first step creates "
                      f"{'/'.join(map(str, sorted(copies))) or 0} tensor(s) the size of each trainable "
                      "parameter" + (" and a step count" if counts else ""))


def _batch_size(data: Any) -> int:
    tensors = [t for t in tree_leaves(data) if isinstance(t, torch.Tensor)]
    if not tensors or tensors[0].dim() == 0:
        raise ValueError("input must be a tensor, or a tuple/list/dict of tensors, with the batch in dim 0")
    return tensors[0].shape[0]


def _take(data: Any, size: int) -> Any:
    """The first ``size`` samples of a tensor or a tuple/list/dict of them (views, no copy)."""
    if isinstance(data, torch.Tensor):
        return data[:size]
    if isinstance(data, dict):
        return {k: _take(v, size) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(_take(v, size) for v in data)
    return data


def _sum_outputs(outputs: Any) -> torch.Tensor:
    return sum(t.float().sum() for t in tree_leaves(outputs) if isinstance(t, torch.Tensor))


def _forward_backward_peaks(model, input, sizes, loss_fn) -> tuple[tuple[int, int], ...]:
    device = _device(_model_device(model))
    batch = _batch_size(input)
    sizes = tuple(sizes) or (batch,)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= batch:
            raise ValueError(f"micro_batch_sizes must be integers in [1, {batch}] (the input's batch), got {size!r}")
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    peaks = []
    try:
        with _fork_rng(device):
            for size in sizes:
                for p in params:
                    p.grad = None  # backward creates them: they count, as in a first step
                x = _take(input, size)
                peaks.append((size, _measure(lambda: (loss_fn or _sum_outputs)(model(x)).backward(), device)[2]))
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)  # BatchNorm's running statistics
    return tuple(peaks)


def summary(model: torch.nn.Module, input: Any = None, *, optimizer: torch.optim.Optimizer | None = None,
            micro_batch_sizes: Iterable[int] = (), loss_fn: Callable[[Any], torch.Tensor] | None = None
            ) -> ModelSummary:
    """Parameters per module (one row per module that owns parameters directly, in model order;
    a shared parameter counts once, in its first module), their bytes, the gradient bytes (the
    trainable parameters'), buffer bytes and the optimizer's state bytes: measured when it has
    state, else estimated from its class (Adam/AdamW 2 copies of the parameters, SGD with
    momentum 1, plain SGD 0, RMSprop 1 (+1 centered, +1 momentum), Adagrad 1; another class:
    None and a note).

    With ``input`` (a tensor, or a tuple/list/dict of tensors with the batch in dim 0, passed to
    ``model(input)`` as is), for each size in ``micro_batch_sizes`` (default: the input's batch)
    runs forward and ``loss_fn(outputs).backward()`` (default: the sum of the outputs) on the
    first ``size`` samples and reports the peak bytes above what existed before: activations,
    temporaries and the gradients backward creates. The model's ``.grad``, parameters, buffers
    and the RNG state are as before afterwards."""
    rows, seen = [], set()
    for name, module in model.named_modules():
        owned = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in owned)
        if owned:
            rows.append(ModuleRow(name, type(module).__name__, sum(p.numel() for p in owned),
                                  sum(p.numel() for p in owned if p.requires_grad),
                                  tuple(sorted({str(p.dtype).removeprefix("torch.") for p in owned})),
                                  _storage_bytes(owned)))
    params = list(model.parameters())
    notes = []
    state_bytes = None
    if optimizer is not None:
        state_bytes, note = _optimizer_state_bytes(optimizer)
        notes += [note] if note else []
    peaks = () if input is None else _forward_backward_peaks(model, input, micro_batch_sizes, loss_fn)
    return ModelSummary(
        modules=tuple(rows), parameters=sum(r.parameters for r in rows), trainable=sum(r.trainable for r in rows),
        parameter_bytes=_storage_bytes(params), gradient_bytes=_tensor_bytes(p for p in params if p.requires_grad),
        buffer_bytes=_storage_bytes(model.buffers()), optimizer_state_bytes=state_bytes,
        activation_peaks=peaks, notes=tuple(notes))


__all__ = ["ModelSummary", "ModuleRow", "summary"]
