"""How a batch bigger than device memory is run: split into micro-batches, three ways.

A *batch* is what a loader yields (inputs and targets with the samples in dim
0; inputs a tensor or a tuple/list/dict of them); it stays where the loader
put it (host memory) and only micro-batches of ``m`` samples go to the device.

* :func:`accumulate` -- the trainer owns the loss: each micro-batch runs
  forward, ``criterion`` and backward on its own, the loss scaled by its share
  of the batch (``n/B`` for a mean-reduced criterion, 1 for ``reduction="sum"``),
  so the accumulated gradient is the batch's. Exact for models whose samples
  do not interact (no batch statistics); the cheapest: one forward per sample.
* :func:`recompute_forward` -- the script owns the loss (``outputs =
  ib.batch_(); loss = criterion(outputs, targets); loss.backward()``): each
  micro-batch runs under non-reentrant activation checkpointing, which keeps
  only its input, and is recomputed (same RNG state) when the script's
  backward reaches it, one micro-batch at a time. The device holds the
  batch's outputs plus one micro-batch's activations; the gradient is the
  whole batch's, whatever the loss (even one mixing samples). Costs one
  extra forward.
* :func:`offload_forward` -- the whole batch runs forward at once with every
  activation autograd saves moved to host memory
  (``torch.autograd.graph.save_on_cpu``) and brought back during backward.
  Keeps batch statistics exact (BatchNorm sees the whole batch); the device
  still holds the largest single layer's input and output for the whole batch.

Batch-statistics layers (BatchNorm and its subclasses) make micro-batches
*ghost batches*: each is normalised with its own statistics and updates the
running statistics once. :func:`batch_norm_layers` finds them; recomputation
restores their running statistics around the second forward so each
micro-batch updates them exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

Inputs = Any  # a tensor, or a tuple/list/dict of tensors (batch in dim 0)


class BatchError(TypeError):
    """A loader's batch flextrain cannot split, named in the message."""


def batch_size_of(inputs: Inputs, *, what: str = "inputs") -> int:
    """The number of samples in ``inputs`` (dim 0 of every tensor in it, which must agree)."""
    sizes = {t.shape[0] if t.dim() else None for t in _tensors(inputs, what=what)}
    if None in sizes:
        raise BatchError(f"{what} holds a 0-dimensional tensor: a batch needs its samples in dim 0")
    if len(sizes) != 1:
        raise BatchError(f"{what} holds tensors of different batch sizes {sorted(sizes)}: they must agree in dim 0")
    return sizes.pop()


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in a tensor or a tuple/list/dict of them (outputs included)."""
    return _tensors(value, what="value")


def _tensors(inputs: Inputs, *, what: str) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, Mapping):
        items = list(inputs.values())
    elif isinstance(inputs, (tuple, list)):
        items = list(inputs)
    else:
        raise BatchError(f"{what} is a {type(inputs).__name__}: expected a tensor, or a tuple, list or dict "
                         "of tensors, with the samples in dim 0")
    out = []
    for item in items:
        out.extend(_tensors(item, what=what))
    if not out:
        raise BatchError(f"{what} holds no tensor")
    return out


def checked_batches(loader: Iterable) -> Iterator[tuple[Any, Any]]:
    """The loader's items, checked to be ``(inputs, targets)`` of tensors with agreeing batch sizes."""
    for index, item in enumerate(loader):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise BatchError(f"the dataloader yielded a {type(item).__name__} as batch {index}: expected "
                             "(inputs, targets)")
        inputs, targets = item
        n = batch_size_of(inputs, what=f"the inputs of batch {index}")
        if batch_size_of(targets, what=f"the targets of batch {index}") != n:
            raise BatchError(f"batch {index}: {n} inputs but {batch_size_of(targets)} targets")
        yield inputs, targets


def take(inputs: Inputs, start: int, stop: int) -> Inputs:
    """Samples ``[start, stop)`` of ``inputs`` (views, no copy)."""
    if isinstance(inputs, torch.Tensor):
        return inputs[start:stop]
    if isinstance(inputs, Mapping):
        return {k: take(v, start, stop) for k, v in inputs.items()}
    return type(inputs)(take(v, start, stop) for v in inputs)


def to_device(inputs: Inputs, device: torch.device | None) -> Inputs:
    if device is None:
        return inputs
    if isinstance(inputs, torch.Tensor):
        return inputs.to(device, non_blocking=True)
    if isinstance(inputs, Mapping):
        return {k: to_device(v, device) for k, v in inputs.items()}
    return type(inputs)(to_device(v, device) for v in inputs)


def slices(total: int, size: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` of each micro-batch: ``ceil(total/size)`` of them, as even as possible
    (sizes differ by at most one, so no micro-batch is a small remainder)."""
    count = max(1, -(-total // size))
    base, extra = divmod(total, count)
    start = 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        yield start, stop
        start = stop


def _call(model: torch.nn.Module, inputs: Inputs) -> Any:
    return model(inputs)  # one argument, whatever its structure (a dict stays a dict)


def _cat(outputs: Sequence[Any]) -> Any:
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs) if len(outputs) > 1 else first
    if isinstance(first, Mapping):
        return {k: _cat([o[k] for o in outputs]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_cat([o[i] for o in outputs]) for i in range(len(first)))
    raise BatchError(f"the model returned a {type(first).__name__}: micro-batch outputs must be tensors "
                     "(or tuples/lists/dicts of them) to be joined into the batch's")


def loss_share(criterion: Any, n: int, total: int) -> float:
    """The factor of a micro-batch's loss so the accumulated gradient is the batch's: ``n/total``
    for a mean (the default of torch's losses and of plain functions), 1 for ``reduction="sum"``."""
    return 1.0 if getattr(criterion, "reduction", "mean") == "sum" else n / total


def accumulate(model: torch.nn.Module, criterion: Callable[[Any, Any], torch.Tensor], inputs: Inputs,
               targets: Any, *, micro_batch: int, device: torch.device | None) -> tuple[float, int]:
    """Forward, loss and backward over ``inputs`` in micro-batches; gradients accumulate in ``.grad``.

    Returns (the batch's loss as the criterion reduces it, samples). The caller steps the optimizer.
    """
    total = batch_size_of(inputs)
    loss_sum = 0.0
    for start, stop in slices(total, micro_batch):
        x = to_device(take(inputs, start, stop), device)
        y = to_device(take(targets, start, stop), device)
        loss = criterion(_call(model, x), y)
        share = loss_share(criterion, stop - start, total)
        (loss * share).backward()
        loss_sum += float(loss.detach()) * share
    return loss_sum, total


def recompute_forward(model: torch.nn.Module, inputs: Inputs, *, micro_batch: int,
                      device: torch.device | None, out_device: torch.device | None = None) -> Any:
    """The batch's outputs, each micro-batch checkpointed (recomputed in the caller's backward)."""
    total = batch_size_of(inputs)
    norms = batch_norm_layers(model)

    def run(x: Inputs) -> Any:
        return _call(model, to_device(x, device))

    def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        return contextlib.nullcontext(), _kept_running_stats(norms)

    outputs = []
    for start, stop in slices(total, micro_batch):
        out = checkpoint(run, take(inputs, start, stop), use_reentrant=False, preserve_rng_state=True,
                         context_fn=contexts)
        outputs.append(to_device(out, out_device))
    return _cat(outputs)


def offload_forward(model: torch.nn.Module, inputs: Inputs, *, device: torch.device | None,
                    out_device: torch.device | None = None) -> Any:
    """The batch's outputs from one forward, activations saved in host memory until backward."""
    x = to_device(inputs, device)
    on_device = device is not None and torch.device(device).type != "cpu"
    context = (torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()) if on_device
               else contextlib.nullcontext())  # on a CPU device activations are in host memory already
    with context:
        out = _call(model, x)
    return to_device(out, out_device)


def batch_norm_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every batch-statistics layer (BatchNorm1d/2d/3d, SyncBatchNorm, LazyBatchNorm)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


@contextlib.contextmanager
def _kept_running_stats(norms: list[tuple[str, torch.nn.Module]]) -> Iterator[None]:
    """Around a recomputation: BatchNorm running statistics as they were (updated once, in the
    first forward; the recomputed forward uses the same batch statistics either way)."""
    saved = [(m, [(b, b.detach().clone()) for b in (m.running_mean, m.running_var, m.num_batches_tracked)
                  if b is not None]) for _, m in norms if m.training and m.track_running_stats]
    try:
        yield
    finally:
        with torch.no_grad():
            for _, buffers in saved:
                for live, old in buffers:
                    live.copy_(old)


__all__ = ["BatchError", "accumulate", "checked_batches", "batch_norm_layers", "batch_size_of", "loss_share", "offload_forward",
           "recompute_forward", "slices", "take", "tensors_of", "to_device"]
