"""``init(G, "auto", ...)``: the micro-batch limit ``M`` found by probing instead of guessed.

A script that cannot know how many samples its device holds passes ``"auto"`` and what a
training step needs: ``model``, ``loss_fn(outputs, targets)``, optionally ``optimizer`` (its
state counts: Adam's moments are as big as the model), and ``sample`` -- one batch
``(inputs, targets)`` of real data, any size (it is tiled to the sizes tried). The probe
(:func:`flextrain.elastic.probe.probe_micro_batch`) finds the largest micro-batch whose forward,
backward and optimizer step fit ``memory_limit`` (default: 90% of the free memory of a CUDA
device, else a fraction of the container's memory), without changing model or optimizer.

Every process of a ``torch.distributed`` world probes its own device and all take the
smallest result (an all-reduce), so every rank plans the same split. ``cache`` (a JSON file)
keeps the result per (model, input shape, device) across restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flextrain.elastic import microbatch as mb
from flextrain.elastic.session import ElasticInitError


def probe_for_init(global_batch_size: int, *, model: Any, loss_fn: Any, sample: Any, optimizer: Any = None,
                   memory_limit: int | str | None = None, cache: str | Path | None = None) -> int:
    """The probed ``M`` (at most ``global_batch_size``), agreed by every rank; raises
    :class:`ElasticInitError` naming what is missing or what did not fit."""
    from flextrain.elastic.memory import default_memory_limit, parse_memory
    from flextrain.elastic.probe import ProbeError, probe_key, probe_micro_batch, training_step

    missing = [name for name, v in (("model", model), ("loss_fn", loss_fn), ("sample", sample)) if v is None]
    if missing:
        raise ElasticInitError(f'init(G, "auto") probes the micro-batch size and needs {", ".join(missing)}= '
                               "(the model, loss_fn(outputs, targets), and one batch (inputs, targets) of real "
                               "data); or pass a number instead of \"auto\"")
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise ElasticInitError(f"sample must be one batch (inputs, targets), got {type(sample).__name__}")
    inputs, targets = sample
    have = mb.batch_size_of(inputs, what="sample's inputs")
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    try:
        limit = parse_memory(memory_limit, what="memory_limit")
    except ValueError as exc:
        raise ElasticInitError(str(exc)) from None
    if limit is None:
        limit = int(torch.cuda.mem_get_info(device)[0] * 0.9) if device.type == "cuda" else default_memory_limit()

    def batch_of(m: int) -> tuple[Any, Any]:
        reps = -(-m // have)
        return (mb.to_device(mb.take(_tile(inputs, reps), 0, m), device),
                mb.to_device(mb.take(_tile(targets, reps), 0, m), device))

    step = training_step(model, optimizer, loss_fn, batch_of)
    try:
        found = probe_micro_batch(step, limit=limit, upper=global_batch_size, device=device, cache=cache,
                                  key=probe_key(model, mb.take(inputs, 0, 1), device) if cache else None)
    except ProbeError as exc:
        raise ElasticInitError(f'init(G, "auto"): {exc}') from None
    return _agreed(found.size, device)


def probe_batch(model: torch.nn.Module, optimizer: Any, criterion: Any, inputs: Any, targets: Any, *,
                device: torch.device, limit: int | None, whole_outputs: bool) -> Any:
    """InfinityBatch's probe on the first samples of a batch (``upper``: the batch); a ProbeResult.

    ``limit`` None: 90% of a CUDA device's free memory, else the container's default. With
    ``whole_outputs`` (``batch_()`` keeps the batch's outputs on the device) the limit leaves
    room for them, their gradient and the loss's two intermediates of their size. The step is
    probed into gradients that exist already, as every micro-step after the first runs (each
    backward then holds its incoming gradients beside the accumulated ones).
    """
    from flextrain.elastic.memory import default_memory_limit
    from flextrain.elastic.probe import probe_micro_batch, training_step

    total = mb.batch_size_of(inputs)
    if limit is None:
        limit = int(torch.cuda.mem_get_info(device)[0] * 0.9) if device.type == "cuda" else default_memory_limit()
    if whole_outputs:
        with torch.no_grad():
            one = model(mb.to_device(mb.take(inputs, 0, 1), device))
        limit -= 4 * total * sum(t.nelement() * t.element_size() for t in mb.tensors_of(one))
    fresh = [p for p in model.parameters() if p.requires_grad and p.grad is None]
    for p in fresh:
        p.grad = torch.zeros_like(p)
    try:
        step = training_step(model, optimizer, criterion, lambda m: (mb.to_device(mb.take(inputs, 0, m), device),
                                                                     mb.to_device(mb.take(targets, 0, m), device)))
        return probe_micro_batch(step, limit=limit, upper=total, device=device)
    finally:
        for p in fresh:
            p.grad = None


def _agreed(size: int, device: torch.device) -> int:
    """The smallest size over the ranks of an initialised process group (else ``size``)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return size
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([size], dtype=torch.int64, device=on)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def _tile(x: Any, reps: int) -> Any:
    if reps <= 1:
        return x
    if isinstance(x, torch.Tensor):
        return x.repeat(reps, *([1] * (x.dim() - 1)))
    if isinstance(x, dict):
        return {k: _tile(v, reps) for k, v in x.items()}
    return type(x)(_tile(v, reps) for v in x)


__all__ = ["probe_batch", "probe_for_init"]
