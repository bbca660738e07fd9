"""``--max-micro-batch auto`` in a worker: the largest micro-batch whose training step fits its memory.

Contract of :func:`probe_worker`, called by an AllReduce worker of a PyTorch module after it built its
model and optimizer and before it registers (so the master knows the size when it forms the worker's
first round):

* The step probed is the worker's own: real records of the job's first training shard (as preflight
  reads "the first training records": from the shard's start, at most ``PROBE_RECORDS`` of them, reused
  in turn when a size needs more) go through the module's ``feed`` once; ``step(m)`` runs the model's
  forward on ``m`` of them, the module's ``loss``, backward and one step of the module's optimizer
  (:func:`flextrain.elastic.probe.training_step`, which puts parameters, buffers, gradients, optimizer
  state and the RNG back as they were: probing never changes training).
* The bound is ``--memory-limit`` (:func:`flextrain.elastic.memory.parse_memory`), else the default
  evaluated here (:func:`memory_limit`): on the CPU :func:`flextrain.elastic.memory.default_memory_limit`
  (80% of the container's limit, else of the available memory) rounded down to a multiple of
  ``DEFAULT_GRAIN`` so that the cache keeps matching while free memory drifts; on a CUDA device 80% of
  the device's memory (the host's says nothing about it). The upper end is the largest
  global batch the job can have (``--global-batch-size``, or ``--max-global-batch`` under
  ``--batch-schedule adaptive``). The result is at most 2% below the largest size that fits.
* The result is cached in ``<job dir>/probe/micro_batch.json`` under
  :func:`flextrain.elastic.probe.probe_key` (the model's structure, the per-sample input, the device) and
  the limit, so a relaunched or newly joining worker, or a resumed job, reads it instead of probing; the
  worker's log says which ("measured" or "read from the cache").
* It returns the ``MicroBatchProbe`` the worker registers with. Even one sample not fitting raises
  :class:`MicroBatchProbeError`, which names ``--memory-limit``; a relaunch would meet the same, so the
  job fails with it.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

from flextrain.elastic.memory import default_memory_limit, format_bytes, parse_memory
from flextrain.elastic.probe import ProbeError, probe_key, probe_micro_batch, training_step
from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.contract import FeedMetadata, Framework, Mode, ModelDefError
from flextrain.worker.module import ModelDef
from flextrain.worker.pytorch import check_loss, feed_tensors, take
from flextrain.worker.reading import job_shards, read_task_records

log = logging.getLogger("flextrain.worker")

PROBE_RECORDS = 1024  # records fed for the probe at most; larger sizes reuse them in turn
DEFAULT_FRACTION = 0.8  # of the memory a worker may use: the default --memory-limit
DEFAULT_GRAIN = 64 << 20  # the CPU default is rounded down to a multiple of this (when above it)
CACHE = Path("probe") / "micro_batch.json"  # under the job directory


class MicroBatchProbeError(ModelDefError):
    """Not even one sample's training step fits the memory limit; the message names --memory-limit."""


def cache_path(spec: JobSpec) -> Path:
    return Path(spec.job_dir) / CACHE


def upper_bound(spec: JobSpec) -> int:
    """The largest micro-batch worth probing: one worker never gets more than a whole global batch."""
    return max(spec.training.global_batch_size, spec.training.max_global_batch or 0)


def memory_limit(spec: JobSpec, device: torch.device) -> int:
    """``--memory-limit`` in bytes, else the default for a step on ``device`` (module docstring)."""
    given = parse_memory(spec.training.memory_limit, what="--memory-limit")
    if given is not None:
        return given
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * DEFAULT_FRACTION)
    limit = default_memory_limit(fraction=DEFAULT_FRACTION)
    return limit - limit % DEFAULT_GRAIN if limit > DEFAULT_GRAIN else limit


def check_framework(spec: JobSpec, model_def: ModelDef) -> None:
    """``--max-micro-batch auto`` and ``--node-check`` step PyTorch modules only: ModelDefError naming a Keras
    module (the CLI, preflight and the worker check it, whichever sees the module first)."""
    if model_def.framework is Framework.PYTORCH:
        return
    if spec.training.auto_micro_batch:
        raise ModelDefError(f"--max-micro-batch auto measures PyTorch training steps; {model_def.path} is a "
                            f"{model_def.framework.value} module: give --max-micro-batch as a number")
    if spec.worker.node_check:
        raise ModelDefError(f"--node-check times PyTorch training steps; {model_def.path} is a "
                            f"{model_def.framework.value} module: leave --node-check off")


class _Accelerated(torch.nn.Module):
    """The model as ``--accelerate``'s strategy runs it (its ``forward``), holding the parameters it steps."""

    def __init__(self, core: torch.nn.Module, forward) -> None:
        super().__init__()
        self.core, self._run = core, forward

    def forward(self, features):
        return self._run(features)


def probe_worker(spec: JobSpec, model_def: ModelDef, model, optimizer, *, time_budget: float = 10.0,
                 compute=None) -> pb.MicroBatchProbe:
    """The largest micro-batch this worker's training step fits in (module docstring). ``compute``: the
    job's ``--accelerate`` strategy as applied (flextrain/worker/accelerating.py): its forward and loss are
    the step probed, and its methods part of the cache key."""
    check_framework(spec, model_def)
    upper = upper_bound(spec)
    features, labels, n = first_records(spec, model_def, upper)

    def batch_of(m: int):
        index = slice(0, m) if m <= n else torch.arange(m) % n  # reuse the records read, in turn
        return take(features, index), take(labels, index)

    loss = model_def.loss if compute is None else compute.loss

    def loss_fn(predictions, targets):
        return check_loss(model_def, loss(targets, predictions), samples=len(targets))

    model.train()
    step = training_step(model if compute is None else _Accelerated(model, compute.forward), optimizer, loss_fn,
                         batch_of)
    device = step.device  # the model's
    limit = memory_limit(spec, device)
    key = probe_key(model, take(features, slice(0, 1)), device)
    if compute is not None:
        key += "+" + hashlib.sha256(compute.description.encode()).hexdigest()[:8]
    path = cache_path(spec)
    try:
        result = probe_micro_batch(step, limit=limit, upper=upper, device=device, cache=path, key=key,
                                   time_budget=time_budget)
    except ProbeError as exc:
        raise MicroBatchProbeError(f"--max-micro-batch auto: {exc} (--memory-limit "
                                   f"{spec.training.memory_limit or f'default: {format_bytes(limit)}'})") from None
    peak = result.peak_bytes or 0
    if result.cached:
        log.info("micro-batch probe: max micro-batch %d read from the cache %s (key %s; limit %s), nothing run",
                 result.size, path, key, format_bytes(limit))
    else:
        log.info("micro-batch probe: max micro-batch %d measured (peak %s of the limit %s; sizes tried %s; "
                 "%.2f s%s), cached in %s", result.size, format_bytes(peak), format_bytes(limit),
                 ", ".join(f"{m}:{'over' if p is None else p}" for m, p in result.tried), result.seconds,
                 "; the time budget ran out: a larger size may fit" if result.truncated else "", path)
    return pb.MicroBatchProbe(max_micro_batch=result.size, memory_limit=limit, peak_bytes=peak,
                              cached=result.cached, device=str(device))


def first_records(spec: JobSpec, model_def: ModelDef, upper: int):
    """(features, labels, n): the first ``n`` (at most ``upper``, :data:`PROBE_RECORDS`) records of the first
    training shard, fed (also what ``--accelerate auto``'s search runs on)."""
    shard = job_shards(spec, Mode.TRAINING, reader=model_def.custom_data_reader)[0]
    n = min(upper, shard.size, PROBE_RECORDS)
    records = read_task_records(model_def, shard.source, shard.start, shard.start + n, mode=Mode.TRAINING,
                                data_origin=spec.data.training)
    meta = FeedMetadata(shard.source, shard.start, shard.start + n, 0)
    features, labels = feed_tensors(model_def, records, Mode.TRAINING, meta)
    return features, labels, n


__all__ = ["CACHE", "PROBE_RECORDS", "MicroBatchProbeError", "cache_path", "check_framework", "first_records",
           "memory_limit", "probe_worker", "upper_bound"]
