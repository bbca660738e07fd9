"""Memory accounting for training: what a model holds, what a step peaks at, what a process uses.

Four pieces (the probe that finds the largest micro-batch is :mod:`flextrain.elastic.probe`):

- :func:`parse_memory` reads a memory size ("4GiB", "512MB", 2**30) and
  :func:`default_memory_limit` gives a fraction of the container's memory;
- :func:`step_peak` runs a callable and measures the peak bytes of tensor memory
  alive during it, absolute, so that it compares with a memory limit directly;
  :func:`static_bytes` is what a model and its optimizer hold between steps;
- :class:`MemoryMonitor` samples a process's memory cheaply, once per step;
- :func:`flextrain.elastic.model_summary.summary` (its own module) counts a model's
  parameters per module, their bytes, the gradient and optimizer-state bytes, and the
  forward+backward peak per micro-batch.

What a peak measures: on CUDA, the caching allocator's statistics (every tensor on
the device); on the CPU, where no allocator keeps any, the storages operators create
during the step (:class:`_Tracker`) plus a ``baseline`` for what existed before it
(:func:`step_peak`). Gradients and optimizer state a first step creates count.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
# TorchDispatchMode lives in a private module but is the documented extension point
# (torch.utils._python_dispatch is what the docs and torch's own tools import).
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# the sizes live in a torch-free module (the master and the CLI read them); re-exported here
from flextrain.elastic.sizes import default_memory_limit, format_bytes, parse_memory  # noqa: F401

# ---- measuring a step ----------------------------------------------------------------------

def _device(device: Any) -> torch.device:
    """None: the CPU. A CUDA device without an index: the current one (its statistics are per device)."""
    if device is None:
        return torch.device("cpu")
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _storages(tensors: Iterable[Any]) -> Iterable[Any]:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.layout == torch.sparse_coo:
            yield from _storages((t._indices(), t._values()))
            continue
        try:
            yield t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass): nothing to count
            continue


def _storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors``: a view or a tied weight counts once, and a
    view counts its whole storage (that is what stays allocated)."""
    seen = {}  # keeping each storage referenced keeps its id unique while we count
    for st in _storages(tensors):
        seen.setdefault(id(st), st)
    return sum(st.nbytes() for st in seen.values())


def _tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of a same-shaped copy of each tensor (what .grad or Adam's moments take)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for entry in optimizer.state.values() for t in tree_leaves(entry) if isinstance(t, torch.Tensor)]


def static_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """What a model and its optimizer hold between steps: parameters, buffers, the gradients that
    exist now and the optimizer's state tensors (and any parameter of the optimizer the model
    lacks), each storage counted once. The ``baseline`` of :func:`step_peak` on the CPU."""
    params = list(model.parameters())
    if optimizer is not None:
        params += [p for group in optimizer.param_groups for p in group["params"]]
    tensors = params + [p.grad for p in params] + list(model.buffers())
    if optimizer is not None:
        tensors += _optimizer_tensors(optimizer)
    return _storage_bytes(tensors)


class _OverLimit(Exception):
    """Raised inside a tracked step once it holds more than its cap (the probe's stop on the CPU)."""

    def __init__(self, held: int) -> None:
        super().__init__(f"the step held {held} bytes, more than its cap")
        self.held = held


# Operators whose output shares its input's storage although the storage is new to torch:
# torch.tensor(data) builds a tensor outside the dispatcher and "lifts" it.
_FRESH = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}


class _Tracker(TorchDispatchMode):
    """Live and peak bytes of the storages that operators create on ``device`` while active.

    Written here rather than using torch.distributed._tools.mem_tracker.MemTracker: that one
    gives the same totals (checked on an MLP step, to the byte) but needs the model and
    optimizer registered, is a private module, and does module bookkeeping we do not need.
    A storage is new when an operator returns it and none of the operator's inputs holds it
    (views, in-place and out= operators return an input's storage). The storage's Python object
    lives exactly as long as the storage (torch keeps it), so a weak reference's callback
    tells when it is freed. Costs a Python call per operator (~3x on a small MLP's step)."""

    def __init__(self, device: torch.device, cap: int | None = None) -> None:
        super().__init__()
        self.device, self.cap = device, cap
        self.live = self.peak = 0
        self._held: dict[int, tuple[weakref.ref, int]] = {}

    def _freed(self, key: int) -> None:
        entry = self._held.pop(key, None)
        if entry is not None:
            self.live -= entry[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = () if func in _FRESH else {id(st) for st in _storages(tree_leaves((args, kwargs)))}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type != self.device.type or (
                    self.device.index is not None and t.device.index != self.device.index):
                continue
            for st in _storages((t,)):
                key, nbytes = id(st), st.nbytes()
                held = self._held.get(key)
                if held is not None:
                    if nbytes != held[1]:  # resized in place (an out= operator growing its output)
                        self.live += nbytes - held[1]
                        self._held[key] = (held[0], nbytes)
                elif key not in inputs:
                    self._held[key] = (weakref.ref(st, lambda _ref, key=key: self._freed(key)), nbytes)
                    self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live
            if self.cap is not None and self.live > self.cap:
                raise _OverLimit(self.live)
        return out

    def close(self) -> None:
        self._held.clear()  # drops the weak references: their callbacks never run


def _measure(fn: Callable[[], Any], device: torch.device, *, cap: int | None = None) -> tuple[Any, int, int]:
    """Run ``fn``; return (its result, bytes allocated on ``device`` at entry (CUDA; 0 on the
    CPU, where that is not known), peak bytes above them during ``fn``). With ``cap`` (CPU only),
    raise :class:`_OverLimit` as soon as more than ``cap`` bytes above the entry are held."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        entry = torch.cuda.memory_allocated(device)
        result = fn()
        return result, entry, torch.cuda.max_memory_allocated(device) - entry
    tracker = _Tracker(device, cap)
    try:
        with tracker:
            result = fn()
    finally:
        tracker.close()
    return result, 0, tracker.peak


@dataclass(frozen=True)
class StepPeak:
    peak_bytes: int  # absolute: compare it with a memory limit
    result: Any  # what fn returned


def step_peak(fn: Callable[[], Any], *, device: Any = None, baseline: int = 0) -> StepPeak:
    """Run ``fn()`` and measure the peak bytes of tensor memory alive during it on ``device``
    (None: the CPU): everything the step holds, parameters and optimizer state included.

    CUDA: the allocator's peak for the device (its peak statistic is reset first), which already
    holds every tensor on the device, so ``baseline`` is not added. CPU: ``baseline`` (the bytes
    that exist before ``fn`` and that it uses: :func:`static_bytes` of the model and optimizer)
    plus the peak of the tensors created during ``fn`` (module docstring: what is seen)."""
    if isinstance(baseline, bool) or not isinstance(baseline, int) or baseline < 0:
        raise ValueError(f"baseline must be a number of bytes >= 0, got {baseline!r}")
    dev = _device(device)
    result, entry, extra = _measure(fn, dev)
    return StepPeak(entry + extra if dev.type == "cuda" else baseline + extra, result)


# ---- monitoring ----------------------------------------------------------------------------

def _rss() -> dict[str, int]:
    try:
        with open("/proc/self/status", "rb") as f:
            status = f.read()
    except OSError:  # not Linux: only the high-water mark is known
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"rss": peak if sys.platform == "darwin" else peak * 1024}
    sample = {}
    for line in status.splitlines():
        if line.startswith((b"VmRSS:", b"VmHWM:")):
            sample["rss" if line.startswith(b"VmRSS") else "peak_rss"] = int(line.split()[1]) * 1024
    return sample


class MemoryMonitor:
    """Memory of this process, sampled once per step (cheap: a few counters or one /proc read).

    On CUDA (``device`` a CUDA device): ``{"allocated", "peak", "reserved"}`` bytes of the device
    from torch.cuda; ``peak`` is the most allocated since the previous sample (the peak statistic
    is reset after each sample, so do not mix it with :func:`step_peak` on the same device). On
    the CPU: ``{"rss", "peak_rss"}`` bytes (VmRSS, VmHWM from /proc/self/status; elsewhere only
    ``rss``, the high-water mark). :meth:`record` keeps the last ``keep`` samples in
    :attr:`history`."""

    def __init__(self, *, device: Any = None, keep: int = 1000) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive integer, got {keep!r}")
        self.device = _device(device)
        self.history: deque[dict[str, int]] = deque(maxlen=keep)

    def sample(self) -> dict[str, int]:
        if self.device.type != "cuda":
            return _rss()
        d = self.device
        sample = {"allocated": torch.cuda.memory_allocated(d), "peak": torch.cuda.max_memory_allocated(d),
                  "reserved": torch.cuda.memory_reserved(d)}
        torch.cuda.reset_peak_memory_stats(d)
        return sample

    def record(self, step: int) -> dict[str, int]:
        """Sample, append ``{"step": step, **sample}`` to :attr:`history` and return it."""
        entry = {"step": step, **self.sample()}
        self.history.append(entry)
        return entry

    @property
    def last(self) -> dict[str, int] | None:
        return self.history[-1] if self.history else None


# ---- shared with the probe and the summary ------------------------------------------------

def _model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); the CPU for a model with neither."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def _fork_rng(device: torch.device) -> Any:
    """A context that puts the CPU's (and a CUDA device's) random number generator back as it was:
    a measured step must not change what dropout draws next."""
    if device.type == "cuda":
        return torch.random.fork_rng(devices=[device.index], device_type="cuda")
    return torch.random.fork_rng(devices=[])


__all__ = ["MemoryMonitor", "StepPeak", "default_memory_limit", "format_bytes", "parse_memory", "static_bytes",
           "step_peak"]
