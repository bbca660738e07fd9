"""The largest micro-batch that fits a memory limit, found by running the training step.

:func:`training_step` turns a model, optimizer, loss and a batch maker into
``step(m)``: one full training step on ``m`` samples (forward, backward,
optimizer step) that leaves no trace — parameters, buffers, ``.grad``, the
optimizer's state and the RNG are put back as they were, so probing never
changes training. :func:`probe_micro_batch` measures ``step(m)``
(:func:`flextrain.elastic.memory.step_peak`) at doubling sizes from ``lower``
until one does not fit (a CUDA out-of-memory error, or a peak above ``limit``),
then narrows the gap (interpolating the measured peaks, bisecting when that
stalls) until the sizes are adjacent or 2% apart: the result is the largest
size that fits, or at most 2% below it. ``M`` for ``init(G, M)`` and
``maxMicroBatch`` come from here.

On the CPU a step that passes the limit is stopped there (the tracker raises at
the operator that crossed it), so a too-large size never takes the machine's
memory. A result can be cached in a JSON file under a key
(:func:`probe_key`: the model's structure, the per-sample input, the device):
the next process reads it instead of probing.
"""

from __future__ import annotations

import copy
import hashlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flextrain.elastic.memory import (_device, _fork_rng, _measure, _model_device, _OverLimit, format_bytes,
                                      parse_memory, static_bytes)
from flextrain.elastic.wrapping import WrappedOptimizer

log = logging.getLogger(__name__)


class ProbeError(ValueError):
    """Even the smallest micro-batch allowed does not fit the memory limit."""


@dataclass(frozen=True)
class ProbeResult:
    size: int  # the largest micro-batch found to fit
    peak_bytes: int | None  # the step's peak at that size (None only when read from a cache without it)
    limit: int
    tried: tuple[tuple[int, int | None], ...]  # (size, peak); None: did not fit (OOM, or stopped at the limit)
    seconds: float
    cached: bool  # read from the cache: nothing was run
    truncated: bool  # time_budget ran out: size fits, a larger one might too


class TrainingStep:
    """``step(m)``: one training step on ``m`` samples that leaves the model and optimizer as they
    were (see :func:`training_step`). :attr:`device` and :attr:`baseline_bytes` (what the model
    and optimizer hold: :func:`static_bytes`) tell :func:`probe_micro_batch` how to measure it."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 loss_fn: Callable[[Any, Any], torch.Tensor], batch_of: Callable[[int], tuple[Any, Any]]) -> None:
        if isinstance(optimizer, WrappedOptimizer):
            optimizer = optimizer.optimizer  # one real step of the inner optimizer; the wrapper's count stays
        self.model, self.optimizer, self.loss_fn, self.batch_of = model, optimizer, loss_fn, batch_of
        self.device = _model_device(model)
        self.baseline_bytes = static_bytes(model, optimizer)
        # The snapshot lives on the host, taken here, outside any measured step: it is not in a
        # step's device peak. It costs host memory the size of baseline_bytes while this lives.
        params = list(model.parameters())
        if optimizer is not None:
            known = {id(p) for p in params}
            params += [p for g in optimizer.param_groups for p in g["params"] if id(p) not in known]
        self._params = [(p, _host(p)) for p in params]
        self._grads = [(p, None if p.grad is None else _host(p.grad)) for p in params]
        self._buffers = [(b, _host(b)) for b in model.buffers()]
        # Per parameter: its state's tensors (host copy, device) and its other values, apart.
        self._state = {} if optimizer is None else {
            p: ({k: (_host(v), v.device) for k, v in s.items() if isinstance(v, torch.Tensor)},
                {k: copy.deepcopy(v) for k, v in s.items() if not isinstance(v, torch.Tensor)})
            for p, s in optimizer.state.items()}
        self._groups = [] if optimizer is None else [
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        self._opt_called = None if optimizer is None else optimizer.__dict__.get("_opt_called")
        self._versions = self._version_now()

    def _version_now(self) -> list[int]:
        return [p._version for p, _ in self._params]

    def __call__(self, m: int) -> None:
        if self._version_now() != self._versions:
            raise RuntimeError("the model's parameters changed since training_step() took its snapshot (was it "
                               "trained in between?): restoring would undo that; call training_step() again")
        try:
            with _fork_rng(_device(self.device)):
                inputs, targets = self.batch_of(m)
                self.loss_fn(self.model(inputs), targets).backward()
                if self.optimizer is not None:
                    self.optimizer.step()
        finally:
            self._restore()

    @torch.no_grad()
    def _restore(self) -> None:
        # In place where possible: a restore allocates nothing, so it adds nothing to the peak.
        for p, saved in self._params:
            p.copy_(saved)
        for b, saved in self._buffers:
            b.copy_(saved)  # BatchNorm's running statistics
        for p, saved in self._grads:
            if saved is None:
                p.grad = None
            elif p.grad is not None and p.grad.shape == saved.shape and p.grad.dtype == saved.dtype:
                p.grad.copy_(saved)
            else:
                p.grad = saved.to(p.device, copy=True)
        if self.optimizer is not None:
            self._restore_optimizer(self.optimizer)
        self._versions = self._version_now()

    def _restore_optimizer(self, opt: torch.optim.Optimizer) -> None:
        for p in [p for p in opt.state if p not in self._state]:
            del opt.state[p]  # state the probed step created (Adam's first step): gone again
        for p, (tensors, others) in self._state.items():
            current = opt.state[p]
            for k in [k for k in current if k not in tensors and k not in others]:
                del current[k]
            current.update(copy.deepcopy(others))
            for k, (host, device) in tensors.items():
                now = current.get(k)
                if isinstance(now, torch.Tensor) and now.shape == host.shape and now.dtype == host.dtype:
                    now.copy_(host)
                else:
                    current[k] = host.to(device, copy=True)
        for group, saved in zip(opt.param_groups, self._groups):
            group.update(copy.deepcopy(saved))
        if self._opt_called is None:
            opt.__dict__.pop("_opt_called", None)
        else:
            opt._opt_called = self._opt_called


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                  loss_fn: Callable[[Any, Any], torch.Tensor], batch_of: Callable[[int], tuple[Any, Any]]
                  ) -> Callable[[int], None]:
    """``step(m)`` for :func:`probe_micro_batch`: ``inputs, targets = batch_of(m)`` (``m`` samples;
    inputs a tensor or a tuple/dict of tensors, passed as ``model(inputs)``), then
    ``loss_fn(model(inputs), targets).backward()`` and ``optimizer.step()`` (unless None; a
    flextrain wrapper's inner optimizer, so its accumulation count is untouched). Afterwards,
    also after an error, parameters, buffers, ``.grad``, the optimizer's state (none, if it had
    none: Adam's first step is undone) and the RNG are as when ``training_step`` was called.

    The snapshot is taken now, on the host: use the step right away. If the parameters change
    in between (training went on), ``step`` raises rather than undoing that training."""
    return TrainingStep(model, optimizer, loss_fn, batch_of)


def _is_oom(error: BaseException) -> bool:
    text = str(error).lower()  # older paths (cuBLAS, the CPU allocator) raise plain RuntimeErrors
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in text or "can't allocate" in text


def _attempt(step: Callable[[int], None], m: int, device: torch.device, limit: int, baseline: int) -> int | None:
    """The peak of ``step(m)``, or None when it did not fit (out of memory, or stopped at the limit)."""
    try:
        if device.type == "cuda":
            _, entry, extra = _measure(lambda: step(m), device)
            return entry + extra
        return baseline + _measure(lambda: step(m), device, cap=limit - baseline)[2]
    except _OverLimit:
        return None
    except RuntimeError as error:
        if not _is_oom(error):
            raise
    if device.type == "cuda":  # out of memory; outside the except block, the traceback's tensors are gone
        torch.cuda.empty_cache()
    return None


def _guess(best: int, bad: int, peaks: dict[int, int], bad_peak: int | None, limit: int) -> int | None:
    """Where the peak crosses the limit, on the line through the fitting size and the failing one
    (or the two largest fitting sizes); None without two points."""
    if bad_peak is not None:
        (m0, p0), (m1, p1) = (best, peaks[best]), (bad, bad_peak)
    elif len(peaks) >= 2:
        (m0, p0), (m1, p1) = sorted(peaks.items())[-2:]
    else:
        return None
    if p1 <= p0 or m1 == m0:
        return None
    return best + int((limit - peaks[best]) * (m1 - m0) // (p1 - p0))


def _search(attempt: Callable[[int], int | None], limit: int, lower: int, first: int, upper: int,
            deadline: float) -> tuple[int, dict[int, int], bool]:
    """Doubling from ``lower`` (which fits, peaking at ``first``), then narrowing; returns the
    largest fitting size, the peaks of the fitting sizes, and whether the deadline cut it short."""
    peaks = {lower: first}
    best, bad, bad_peak, stalls = lower, None, None, 0
    while best < upper:  # grow: doubling
        if time.monotonic() > deadline:
            return best, peaks, True
        m = min(2 * best, upper)
        peak = attempt(m)
        if peak is None or peak > limit:
            bad, bad_peak = m, peak
            break
        best, peaks[m] = m, peak
    while bad is not None and bad - best > 1 and bad - best > 0.02 * best:  # narrow
        if time.monotonic() > deadline:
            return best, peaks, True
        width, mid = bad - best, (best + bad) // 2
        guess = None if stalls >= 2 else _guess(best, bad, peaks, bad_peak, limit)
        m = mid if guess is None else min(max(guess, best + 1), bad - 1)
        peak = attempt(m)
        if peak is None or peak > limit:
            bad, bad_peak = m, peak
        else:
            best, peaks[m] = m, peak
        stalls = 0 if bad - best <= width // 2 else stalls + 1
    return best, peaks, False


def probe_micro_batch(step: Callable[[int], None], *, limit: int | str, upper: int, device: Any = None,
                      lower: int = 1, cache: str | Path | None = None, key: str | None = None,
                      time_budget: float = 10.0, baseline: int | None = None) -> ProbeResult:
    """The largest ``m`` in [``lower``, ``upper``] whose ``step(m)`` fits: no CUDA out-of-memory
    error and a peak (:func:`flextrain.elastic.memory.step_peak`) of at most ``limit`` bytes
    (an int, or a size :func:`parse_memory` reads, e.g. "6GiB"). Exact, or at most 2% below.

    ``device`` and (CPU) ``baseline`` default to the step's own (:class:`TrainingStep`), else the
    CPU and 0. Raises :class:`ProbeError` when ``lower`` does not fit. Past ``time_budget``
    seconds no new size is tried and the largest fitting one so far is returned, ``truncated``.
    With ``cache`` (a JSON file) and ``key``: a result cached for this key and limit is returned
    without running anything (``cached=True``); a new one is written (atomically; other keys
    kept; a truncated one is not cached)."""
    limit = parse_memory(limit, what="limit")
    if limit is None:
        raise ValueError("limit must be given: the bytes a step may peak at, e.g. limit='6GiB'")
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if upper < lower:
        raise ValueError(f"upper ({upper}) is below lower ({lower})")
    if cache is not None and not key:
        raise ValueError("cache needs a key naming what was probed, e.g. key=probe_key(model, example_input, device)")
    dev = _device(device if device is not None else getattr(step, "device", None))
    base = baseline if baseline is not None else getattr(step, "baseline_bytes", 0)
    started = time.monotonic()
    if cache is not None:
        hit = _cached(Path(cache), key, limit, lower, upper)
        if hit is not None:
            return ProbeResult(hit["size"], hit.get("peak_bytes"), limit, (), time.monotonic() - started, True, False)
    tried: list[tuple[int, int | None]] = []

    def attempt(m: int) -> int | None:
        peak = _attempt(step, m, dev, limit, base)
        tried.append((m, peak))
        log.debug("probe: micro-batch %d peaked at %s", m, "over the limit" if peak is None else peak)
        return peak

    first = attempt(lower)
    if first is None or first > limit:
        need = ("ran out of device memory" if dev.type == "cuda" else "passed it and was stopped") \
            if first is None else f"peaked at {format_bytes(first)} ({first} bytes)"
        raise ProbeError(
            f"micro-batch {lower} does not fit in the memory limit of {format_bytes(limit)} ({limit} bytes): its "
            f"training step {need}; the model and optimizer alone hold {format_bytes(base)}. Raise the limit, use a "
            "smaller model, lower precision or activation checkpointing, or a smaller lower bound")
    best, peaks, truncated = _search(attempt, limit, lower, first, upper, started + time_budget)
    result = ProbeResult(best, peaks[best], limit, tuple(tried), time.monotonic() - started, False, truncated)
    log.info("probe: micro-batch %d fits in %s (peak %s; %d sizes tried in %.2f s%s)", best, format_bytes(limit),
             format_bytes(peaks[best]), len(tried), result.seconds, ", truncated" if truncated else "")
    if cache is not None and not truncated:
        _store(Path(cache), key, {"size": best, "peak_bytes": peaks[best], "limit": limit, "lower": lower,
                                  "upper": upper, "seconds": round(result.seconds, 3)})
    return result


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        log.warning("probe cache %s is unreadable (%s): probing again, and rewriting it", path, error)
        return {}
    return data if isinstance(data, dict) else {}


def _cached(path: Path, key: str, limit: int, lower: int, upper: int) -> dict[str, Any] | None:
    """The entry for ``key`` if it answers this probe: same limit, its size in [lower, upper], and
    not a size that was capped by a smaller ``upper`` than now (a larger one might fit)."""
    entry = _read(path).get(key)
    if not isinstance(entry, dict) or entry.get("limit") != limit or not isinstance(entry.get("size"), int):
        return None
    size = entry["size"]
    if not lower <= size <= upper or (size >= entry.get("upper", size) and size != upper):
        return None
    return entry


def _store(path: Path, key: str, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The workers of a job probe at once and each adds its entry: without the lock one read-modify-write
    # could drop another's (seen: a resumed job re-probed the worker whose entry was lost).
    with open(path.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _store_locked(path, key, entry)


def _store_locked(path: Path, key: str, entry: dict[str, Any]) -> None:
    data = _read(path)
    data[key] = entry
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def probe_key(model: torch.nn.Module, example_input: Any, device: Any) -> str:
    """A cache key, the same in every process, for what decides a step's memory: the model's class,
    its parameters' and buffers' names, shapes, dtypes and trainability, each input tensor's
    per-sample shape and dtype (dim 0 is the batch), the device type and the torch version."""
    digest = hashlib.sha256()
    cls = type(model)
    kind = "cuda" if isinstance(device, int) and not isinstance(device, bool) else torch.device(device).type
    lines = [f"{cls.__module__}.{cls.__qualname__}", torch.__version__, kind]
    lines += [f"p {n} {tuple(p.shape)} {p.dtype} {p.requires_grad}" for n, p in model.named_parameters()]
    lines += [f"b {n} {tuple(b.shape)} {b.dtype}" for n, b in model.named_buffers()]
    lines += [f"x {path} {tuple(t.shape[1:])} {t.dtype}" for path, t in _tensor_paths(example_input, "")]
    digest.update("\n".join(lines).encode())
    return f"{cls.__qualname__}/{kind}/{digest.hexdigest()[:16]}"


def _tensor_paths(data: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(data, torch.Tensor):
        return [(path, data)]
    if isinstance(data, dict):
        return [item for k in sorted(data, key=str) for item in _tensor_paths(data[k], f"{path}.{k}")]
    if isinstance(data, list | tuple):
        return [item for i, v in enumerate(data) for item in _tensor_paths(v, f"{path}[{i}]")]
    return []


__all__ = ["ProbeError", "ProbeResult", "TrainingStep", "probe_key", "probe_micro_batch", "training_step"]
