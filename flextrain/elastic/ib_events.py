"""What :class:`~flextrain.elastic.infinity.InfinityBatch` tells its user: callbacks, history, warnings.

* **Callbacks**: objects with any of ``on_epoch_start(ib, epoch)``,
  ``on_batch_start(ib, batch)``, ``on_batch_end(ib, batch, stats)``,
  ``on_step(ib, step)``, ``on_epoch_end(ib, epoch, stats)`` (subclass
  :class:`Callback` or not: a missing method is skipped). They run in the
  order given, in the order of those names within an epoch.
* **History**: one dict per epoch (``epoch``, ``loss``, ``samples``,
  ``seconds``, ``samples_per_s``, ``steps``, ``micro_batch_size``, and the
  memory monitor's last sample), writable as CSV or JSON.
* **Event monitor**: in a script's own loop, a forgotten ``ib.step()`` or
  ``ib.zero_grad()`` silently trains something else (gradients of several
  batches summed, or nothing applied); :class:`EventMonitor` warns once per
  kind of slip with :class:`LoopWarning`, naming the call that was missed.
"""

from __future__ import annotations

import csv
import json
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EVENTS = ("on_epoch_start", "on_batch_start", "on_batch_end", "on_step", "on_epoch_end")


class LoopWarning(UserWarning):
    """A custom training loop around InfinityBatch missed a call (step, zero_grad, backward)."""


class Callback:
    """No-op base: override the events you need (see the module docstring)."""

    def on_epoch_start(self, ib: Any, epoch: int) -> None: ...
    def on_batch_start(self, ib: Any, batch: int) -> None: ...
    def on_batch_end(self, ib: Any, batch: int, stats: dict) -> None: ...
    def on_step(self, ib: Any, step: int) -> None: ...
    def on_epoch_end(self, ib: Any, epoch: int, stats: dict) -> None: ...


class Callbacks(list):
    """The callbacks of one InfinityBatch, fired in order."""

    def fire(self, event: str, *args: Any) -> None:
        for cb in self:
            method = getattr(cb, event, None)
            if method is not None:
                method(*args)

    @staticmethod
    def check(callbacks: Iterable[Any]) -> list[Any]:
        out = list(callbacks)
        for cb in out:
            if not any(callable(getattr(cb, e, None)) for e in EVENTS):
                raise TypeError(f"callback {cb!r} has none of the methods {', '.join(EVENTS)}")
        return out


class History(list):
    """Per-epoch stats (dicts), oldest first; :meth:`save` writes them as CSV or JSON by suffix."""

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(list(self), indent=1) + "\n")
        elif path.suffix.lower() == ".csv":
            keys: list[str] = []
            for row in self:
                keys += [k for k in _flat(row) if k not in keys]
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=keys)
                writer.writeheader()
                writer.writerows(_flat(row) for row in self)
        else:
            raise ValueError(f"history file {path}: the name must end in .csv or .json")
        return path


def _flat(row: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class EventMonitor:
    """Watches the calls of a script's own loop and warns (once per kind) about a missed one."""

    def __init__(self) -> None:
        self.pending_step = False  # gradients computed since the last step()
        self.pending_zero = False  # step() ran, zero_grad() has not since
        self.batches_since_step = 0
        self._warned: set[str] = set()

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, LoopWarning, stacklevel=4)

    def on_batch(self) -> None:
        if self.pending_step and self.batches_since_step >= 1:
            self._warn("step", "ib.batch_() was called again without ib.step() after the previous batch's "
                               "backward: the gradients of both batches add up and nothing was applied "
                               "(call ib.step() after loss.backward())")
        if self.pending_zero:
            self._warn("zero_grad", "ib.batch_() after ib.step() without ib.zero_grad(): the applied batch's "
                                    "gradients will be added to this one's (call ib.zero_grad() after ib.step())")
        self.batches_since_step += 1
        self.pending_step = True

    def on_step(self, *, has_grad: bool) -> None:
        if not has_grad:
            self._warn("backward", "ib.step() with no gradients: loss.backward() was not called on this "
                                   "batch's loss, so the step changes nothing (or only weight decay)")
        self.pending_step, self.pending_zero, self.batches_since_step = False, True, 0

    def on_zero_grad(self) -> None:
        self.pending_zero = False


__all__ = ["Callback", "Callbacks", "EventMonitor", "History", "LoopWarning"]
