"""``InfinityBatch``: train with batches bigger than device memory, infinitybatch's API done for real.

infinitybatch (docs: ``shared/reference/infinitybatch.md``) offers a
Keras-like manager (``ib(epochs)``), an epoch call (``ib.epoch()``) and a
custom loop that keeps the script's own forward/loss/backward/step lines.
Its implementation runs the model one sample at a time and keeps every
sample's graph on the device until backward, so it bounds nothing and steps
once per loader batch. This one runs micro-batches of ``micro_batch_size``
samples (:mod:`flextrain.elastic.microbatch`), the batch itself staying in
host memory:

* ``ib(epochs)`` / ``ib.train(epochs)`` / ``ib.epoch()``: per loader batch,
  exact gradient accumulation over its micro-batches and one optimizer step
  (``mechanism="accumulate"``; ``"recompute"`` or ``"offload"`` also work);
* the custom loop (``outputs = ib.batch_(); loss = ib.criterion(outputs,
  targets); loss.backward(); ib.step(); ib.zero_grad()``): ``batch_()``
  returns the whole batch's outputs, each micro-batch checkpointed and
  recomputed during the script's backward (``"recompute"``, the default), or
  computed at once with activations offloaded to host memory (``"offload"``:
  exact BatchNorm statistics, less memory saved).

The update equals one optimizer step on the whole batch (exactly, up to
float summation order) for models without batch statistics. With BatchNorm
the micro-batches are ghost batches (a warning says so once); ``"offload"``
keeps full-batch statistics. ``max_micro_batch``: an int, ``"auto"`` (probe
the largest that fits ``memory_limit``, :mod:`flextrain.elastic.probe`) or
None (the whole batch when no limit is known on CPU; else probed).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from flextrain.elastic import microbatch as mb
from flextrain.elastic.ib_events import Callbacks, EventMonitor, History
from flextrain.elastic.progress import report, restored_step
from flextrain.elastic.world import warn_if_alone

log = logging.getLogger(__name__)

MECHANISMS = ("auto", "accumulate", "recompute", "offload")
ENV_MICRO_BATCH = "FLEXTRAIN_MAX_MICRO_BATCH"  # defaults of max_micro_batch and memory_limit
ENV_MEMORY_LIMIT = "FLEXTRAIN_MEMORY_LIMIT"


class GhostBatchWarning(UserWarning):
    """The model has batch-statistics layers and runs in micro-batches: ghost batches."""


class InfinityBatch:
    def __init__(self, max_micro_batch: int | str | None = None, memory_limit: int | str | None = None,
                 device: Any = None, verbose: bool = False, *, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, criterion: Callable | None = None,
                 dataloader: Iterable | None = None, backward_device: Any = None, mechanism: str = "auto",
                 callbacks: Iterable[Any] = (), keep_batches: int = 8) -> None:
        from flextrain.elastic.memory import MemoryMonitor, parse_memory

        if max_micro_batch is None:  # a script kept as written can still be told (docs/infinity-batch.md)
            max_micro_batch = _env_micro_batch()
        if memory_limit is None:
            memory_limit = os.environ.get(ENV_MEMORY_LIMIT) or None
        if not (max_micro_batch is None or max_micro_batch == "auto"
                or (isinstance(max_micro_batch, int) and not isinstance(max_micro_batch, bool) and max_micro_batch > 0)):
            raise ValueError(f'max_micro_batch must be a positive integer, "auto" or None, got {max_micro_batch!r}')
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
        self.max_micro_batch = max_micro_batch
        self.memory_limit = parse_memory(memory_limit, what="memory_limit")
        self._device = None if device is None else torch.device(device)
        self._backward_device = None if backward_device is None else torch.device(backward_device)
        self.verbose = bool(verbose)
        self.model, self.optimizer, self.criterion = model, optimizer, criterion
        self._loader = dataloader
        self.mechanism = mechanism
        self.callbacks = Callbacks(Callbacks.check(callbacks))
        self.history = History()
        self.memory = MemoryMonitor(device=self._device)
        self.micro_batch_size: int | None = None  # the size in use (set by the first batch)
        self.probe = None  # the ProbeResult when the size was probed
        self._probed_on = 0  # the batch size it was probed on
        self.inputs: deque = deque(maxlen=keep_batches)  # the last batches, detached (bounded)
        self.targets: deque = deque(maxlen=keep_batches)
        self.outputs: deque = deque(maxlen=keep_batches)
        self.losses: deque = deque(maxlen=keep_batches)
        self.epochs_done = 0
        self.steps_done = 0
        self._current: tuple[Any, Any] | None = None  # the batch ib.dataloader yielded last
        self._last_loss: torch.Tensor | None = None
        self._outputs_live: Any = None  # the last batch_()'s outputs, graph and all, for loss()
        self._warned_ghost = False
        self._monitor = EventMonitor()

    # ---- the reference's surface ---------------------------------------------------
    @property
    def optimier(self) -> torch.optim.Optimizer | None:
        """The reference README's spelling of :attr:`optimizer` (an alias, not a second attribute)."""
        return self.optimizer

    @optimier.setter
    def optimier(self, value: torch.optim.Optimizer) -> None:
        self.optimizer = value

    @property
    def verbose_mode(self) -> bool:
        return self.verbose

    @verbose_mode.setter
    def verbose_mode(self, value: bool) -> None:
        self.verbose = bool(value)

    @property
    def device(self) -> torch.device:
        """The device micro-batches run on: as given, else the model's, else the CPU."""
        if self._device is not None:
            return self._device
        param = next(iter(self.model.parameters()), None) if self.model is not None else None
        return param.device if param is not None else torch.device("cpu")

    @device.setter
    def device(self, value: Any) -> None:
        self._device = None if value is None else torch.device(value)

    @property
    def backward_device(self) -> torch.device:
        """Where ``batch_()`` gathers the batch's outputs and ``ib.dataloader`` puts the targets."""
        return self._backward_device or self.device

    @backward_device.setter
    def backward_device(self, value: Any) -> None:
        self._backward_device = None if value is None else torch.device(value)

    @property
    def dataloader(self) -> Iterable | None:
        """Iterating it yields the loader's ``(inputs, targets)`` (targets on :attr:`backward_device`)
        and makes that batch the one ``batch_()`` works on."""
        return None if self._loader is None else _Feed(self)

    @dataloader.setter
    def dataloader(self, value: Iterable) -> None:
        self._loader = value.loader if isinstance(value, _Feed) else value

    # ---- manager loops -------------------------------------------------------------
    def __call__(self, epochs: int) -> History:
        return self.train(epochs)

    def train(self, epochs: int) -> History:
        """Train ``epochs`` epochs (what ``ib(epochs)`` does); returns :attr:`history`."""
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        for _ in range(epochs):
            self.epoch()
        return self.history

    def epoch(self) -> dict:
        """One pass over the loader, one optimizer step per batch; returns (and records) its stats."""
        self._require("model", "optimizer", "criterion", "dataloader")
        if self.epochs_done == 0:
            warn_if_alone()
        epoch = self.epochs_done
        self.callbacks.fire("on_epoch_start", self, epoch)
        self.model.train()
        start, loss_sum, samples, steps = time.perf_counter(), 0.0, 0, 0
        for index, (inputs, targets) in enumerate(mb.checked_batches(self._loader)):
            self.callbacks.fire("on_batch_start", self, index)
            loss, n = self._train_batch(inputs, targets)
            self.optimizer.step()
            self.optimizer.zero_grad()
            steps += 1
            self.steps_done += 1
            self.memory.record(self.steps_done)
            if not hasattr(self.optimizer, "real_steps"):  # an elastic.torch.Optimizer reports its own steps
                report(step=restored_step() + self.steps_done, loss=loss, samples=n)  # the job's history (in a script job)
            self.callbacks.fire("on_step", self, self.steps_done)
            loss_sum, samples = loss_sum + loss * n, samples + n
            self.callbacks.fire("on_batch_end", self, index, {"loss": loss, "samples": n})
        seconds = time.perf_counter() - start
        if samples == 0:
            raise ValueError("ib.dataloader yielded no batch: nothing to train")
        stats = {"epoch": epoch, "loss": loss_sum / samples, "samples": samples, "seconds": round(seconds, 4),
                 "samples_per_s": round(samples / seconds, 2) if seconds > 0 else None, "steps": steps,
                 "micro_batch_size": self.micro_batch_size, "memory": dict(self.memory.last or {})}
        self.history.append(stats)
        self.epochs_done += 1
        if self.verbose:
            print(f"epoch {epoch + 1}: loss {stats['loss']:.4f}, {samples} samples, "
                  f"{stats['samples_per_s']} samples/s, micro-batches of {self.micro_batch_size}")
        self.callbacks.fire("on_epoch_end", self, epoch, stats)
        return stats

    def _train_batch(self, inputs: Any, targets: Any) -> tuple[float, int]:
        total = mb.batch_size_of(inputs)
        micro = self._micro_for(inputs, targets, total)
        if self.mechanism in ("auto", "accumulate"):
            loss, n = mb.accumulate(self.model, self.criterion, inputs, targets, micro_batch=micro,
                                    device=self.device)
            self._keep(inputs, targets, None, loss)
            return loss, n
        outputs = self._forward(inputs, micro)
        loss = self.criterion(outputs, mb.to_device(targets, self.backward_device))
        loss.backward()
        self._keep(inputs, targets, outputs, loss)
        return float(loss.detach()), total

    # ---- the custom loop -----------------------------------------------------------
    def batch_(self, inputs: Any = None) -> Any:
        """The outputs of the whole batch (``inputs``, else the batch current in ``ib.dataloader``),
        ready for the script's loss and ``backward()``; micro-batches bound the device memory."""
        self._require("model")
        if inputs is None:
            if self._current is None:
                raise RuntimeError("ib.batch_() without inputs needs a batch: iterate ib.dataloader "
                                   "(for inputs, targets in ib.dataloader: ...) or pass batch_(inputs)")
            inputs, targets = self._current
        else:
            targets = None
        self._monitor.on_batch()
        total = mb.batch_size_of(inputs)
        micro = self._micro_for(inputs, targets, total, whole_outputs=self.mechanism != "offload")
        outputs = self._forward(inputs, micro)
        self._keep(inputs, targets, outputs, None)
        return outputs

    def _forward(self, inputs: Any, micro: int) -> Any:
        if self.mechanism == "offload":
            return mb.offload_forward(self.model, inputs, device=self.device, out_device=self.backward_device)
        if micro >= mb.batch_size_of(inputs):  # fits whole: no recomputation needed
            return mb.to_device(self.model(mb.to_device(inputs, self.device)), self.backward_device)
        return mb.recompute_forward(self.model, inputs, micro_batch=micro, device=self.device,
                                    out_device=self.backward_device)

    def loss(self, outputs: Any = None, targets: Any = None) -> torch.Tensor:
        """``criterion(outputs, targets)``, by default of the last ``batch_()`` and its targets."""
        self._require("criterion")
        if outputs is None:
            outputs = self._outputs_live
        if targets is None:
            targets = self.targets[-1] if self.targets else None
        if outputs is None or targets is None:
            raise RuntimeError("ib.loss() needs outputs and targets: call ib.batch_() on a batch of "
                               "ib.dataloader first, or pass them")
        self._last_loss = self.criterion(outputs, mb.to_device(targets, self.backward_device))
        self.losses.append(self._last_loss.detach())
        return self._last_loss

    def backward(self) -> None:
        """``backward()`` of the last :meth:`loss`."""
        if self._last_loss is None:
            raise RuntimeError("ib.backward() needs a loss: call ib.loss() first")
        self._last_loss.backward()
        self._last_loss = None

    def step(self) -> None:
        """The optimizer's step (after the script's ``loss.backward()``)."""
        self._require("optimizer")
        has_grad = any(p.grad is not None for g in self.optimizer.param_groups for p in g["params"])
        self._monitor.on_step(has_grad=has_grad)
        self.optimizer.step()
        self.steps_done += 1
        self.memory.record(self.steps_done)
        self.callbacks.fire("on_step", self, self.steps_done)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._require("optimizer")
        self._monitor.on_zero_grad()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # ---- evaluation ----------------------------------------------------------------
    def eval(self, dataloader: Iterable | None = None, metrics: dict[str, Any] | None = None) -> dict:
        """Metrics over ``dataloader`` (default: ib.dataloader's loader) in micro-batches, no grad.

        ``metrics``: name -> ``fn(outputs, targets)`` giving the mean over its samples (a number or
        scalar tensor), or ``"accuracy"`` (argmax over dim 1 equals the target). Default:
        ``{"loss": criterion}``. Each is averaged over all samples, weighted by micro-batch size.
        """
        self._require("model")
        loader = self._loader if dataloader is None else dataloader
        if loader is None:
            raise ValueError("ib.eval() needs a dataloader: pass eval(dataloader) or set ib.dataloader")
        if metrics is None:
            self._require("criterion")
            metrics = {"loss": self.criterion}
        fns = {name: _accuracy if fn == "accuracy" else fn for name, fn in metrics.items()}
        for name, fn in fns.items():
            if not callable(fn):
                raise TypeError(f"metric {name!r} must be callable(outputs, targets) or 'accuracy', got {fn!r}")
        sums, samples = dict.fromkeys(fns, 0.0), 0
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for inputs, targets in mb.checked_batches(loader):
                    total = mb.batch_size_of(inputs)
                    micro = self._micro_for(inputs, targets, total)
                    for start, stop in mb.slices(total, micro):
                        out = self.model(mb.to_device(mb.take(inputs, start, stop), self.device))
                        y = mb.to_device(mb.take(targets, start, stop), self.device)
                        for name, fn in fns.items():
                            sums[name] += float(fn(out, y)) * (stop - start)
                    samples += total
        finally:
            self.model.train(was_training)
        return {**{name: s / samples for name, s in sums.items()}, "samples": samples} if samples else {"samples": 0}

    # ---- helpers -------------------------------------------------------------------
    def _keep(self, inputs: Any, targets: Any, outputs: Any, loss: Any) -> None:
        self._outputs_live = outputs  # the deques hold detached copies
        self.inputs.append(inputs)
        if targets is not None:
            self.targets.append(targets)
        if outputs is not None:
            self.outputs.append(outputs.detach() if isinstance(outputs, torch.Tensor) else outputs)
        if loss is not None:
            self.losses.append(loss)

    def _require(self, *names: str) -> None:
        attrs = {"dataloader": self._loader}
        missing = [n for n in names if (attrs[n] if n in attrs else getattr(self, n)) is None]
        if missing:
            raise RuntimeError(f"InfinityBatch needs ib.{', ib.'.join(missing)} set first "
                               "(or passed to InfinityBatch(...))")

    def _micro_for(self, inputs: Any, targets: Any, total: int, *, whole_outputs: bool = False) -> int:
        """The micro-batch size for a batch of ``total`` samples (probed once when asked).
        ``whole_outputs``: the batch's outputs stay on the device (batch_()): the probe's limit
        leaves room for them, their gradient and the loss's two intermediates of their size."""
        # Probed again when a batch is bigger than the one probed on and that one fitted whole
        # (the probe stopped at its size, not at the memory limit).
        regrow = self.probe is not None and self.probe.size == self._probed_on < total
        if self.micro_batch_size is None or regrow:
            self._probed_on = total
            self.micro_batch_size = self._resolve(inputs, targets, total, whole_outputs=whole_outputs)
            self._warn_ghost(total)
        return min(self.micro_batch_size, total)

    def _resolve(self, inputs: Any, targets: Any, total: int, *, whole_outputs: bool) -> int:
        if isinstance(self.max_micro_batch, int):
            return self.max_micro_batch
        on_cuda = self.device.type == "cuda"
        if self.max_micro_batch is None and self.memory_limit is None and not on_cuda:
            return total  # no limit known: the batch is taken to fit
        from flextrain.elastic.autosize import probe_batch

        self._require("criterion")
        if targets is None:
            raise RuntimeError("probing the micro-batch size needs targets: use ib.dataloader, or set "
                               "max_micro_batch")
        self.probe = probe_batch(self.model, self.optimizer, self.criterion, inputs, targets, device=self.device,
                                 limit=self.memory_limit, whole_outputs=whole_outputs)
        if self.verbose:
            print(f"micro-batch size {self.probe.size} (probed in {self.probe.seconds:.1f}s under "
                  f"{self.probe.limit} bytes)")
        return self.probe.size

    def _warn_ghost(self, total: int) -> None:
        norms = mb.batch_norm_layers(self.model) if self.model is not None else []
        if norms and self.micro_batch_size < total and self.mechanism != "offload" and not self._warned_ghost:
            self._warned_ghost = True
            names = ", ".join(n for n, _ in norms[:3]) + (", ..." if len(norms) > 3 else "")
            warnings.warn(f"the model has batch-statistics layers ({names}) and batches of {total} run in "
                          f"micro-batches of {self.micro_batch_size}: each micro-batch is a ghost batch, "
                          "normalised with its own statistics and updating the running statistics once. "
                          "mechanism='offload' keeps the whole batch's statistics", GhostBatchWarning,
                          stacklevel=4)


class _Feed:
    """``ib.dataloader`` as iterated: the loader's batches, each made current for ``batch_()``."""

    def __init__(self, ib: InfinityBatch) -> None:
        self.ib, self.loader = ib, ib._loader

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for inputs, targets in mb.checked_batches(self.loader):
            self.ib._current = (inputs, targets)
            yield inputs, mb.to_device(targets, self.ib.backward_device)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _env_micro_batch() -> int | str | None:
    value = os.environ.get(ENV_MICRO_BATCH, "").strip()
    if not value:
        return None
    if value == "auto" or not value.isdigit():
        return value  # "auto", or checked (and refused, naming it) by the constructor
    return int(value)


def _accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float((outputs.argmax(dim=1) == targets).float().mean())


__all__ = ["GhostBatchWarning", "InfinityBatch", "MECHANISMS"]
