"""How a script (``flextrain run``) reports its training progress into the job's history.

Inside a script job, the worker's agent (flextrain/worker/script_agent.py) names a file in
``FLEXTRAIN_PROGRESS_FILE``; :func:`report` appends one JSON line to it per optimizer step
(``step``, ``loss``, ``samples``), and the agent's heartbeat carries what was appended since
its last one to the master, which records it in ``events.jsonl``, TensorBoard and
``status.json`` like a module job's progress. Outside a job (no such variable) every function
here is a no-op, so scripts call them unconditionally.

The APIs for scripts report by themselves where they see the step: ``elastic.torch.Optimizer``
reports each real step (with the losses given to :func:`report_loss` since the last one, or
passed through ``optimizer.scale(loss)``), ``InfinityBatch`` each trained batch, ``auto_accelerate``'s
optimizer each step (with the losses its ``loss_func`` returned since the last), and the Keras
``elastic.keras.Model.fit`` each update (a callback). A script with its own loop (a Keras custom
loop's ``elastic.keras.Optimizer`` runs inside ``tf.function``, where no file can be written) calls
:func:`report` (or :func:`report_loss` before ``optimizer.step()``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from typing import Any

ENV_PROGRESS_FILE = "FLEXTRAIN_PROGRESS_FILE"

_pending: list[Any] = []  # losses given since the last report (tensors: read at the report, once per step)
_last_step = 0  # the step this process last reported, or the one committed with the State it restored
_restored_step = 0  # the step committed with the State this process restored


def active() -> bool:
    """Whether this process runs inside a script job that records its progress."""
    return bool(os.environ.get(ENV_PROGRESS_FILE))


def report_loss(loss: Any) -> None:
    """A micro-batch's (or step's) loss, a tensor or a number; the next :func:`report` (an
    ``elastic.torch.Optimizer`` real step) reports the mean of those given since the last. Anything
    else is a TypeError here, in or out of a job (not an error inside flextrain at the next step)."""
    if not _is_loss(loss):
        shape = f" of shape {tuple(loss.shape)}" if hasattr(loss, "shape") else ""
        raise TypeError(f"report_loss takes a loss: a number or a one-element tensor, got "
                        f"{type(loss).__name__}{shape} ({loss!r:.60})")
    note_loss(loss)


def note_loss(loss: Any) -> None:
    """:func:`report_loss` for what flextrain's own wrappers see pass (``Optimizer.scale``, a checked
    loss_func): a value that is not one loss is not recorded, and not the user's error either."""
    if active() and _is_loss(loss):
        _pending.append(loss.detach() if hasattr(loss, "detach") else loss)


def _is_loss(value: Any) -> bool:
    numel = getattr(value, "numel", None)
    return not isinstance(value, bool) and (isinstance(value, numbers.Real) or (callable(numel) and numel() == 1))


def last_step() -> int:
    """The step this process last reported (what ``State.commit`` records with the commit), else the
    one committed with the ``State`` it restored, else 0."""
    return _last_step


def restored_step() -> int:
    """The step committed with the ``State`` this process restored (0: none restored). Wrappers that count
    their own steps from 1 report ``restored_step() + count``, so a script restarted from a commit
    continues the job's step count instead of starting again from 1."""
    return _restored_step


def restored(step: int) -> None:
    """``State.restore``: the commit restored was made after step ``step``."""
    global _last_step, _restored_step
    _last_step = _restored_step = int(step)


def report(*, step: int, loss: float | None = None, samples: int = 0) -> None:
    """Report optimizer step ``step`` (the script's global step count), its ``loss`` (None: the
    mean of :func:`report_loss`'s since the last report, if any) and the ``samples`` this process
    trained in it. Appends one line; never raises for want of a job (a no-op outside one)."""
    global _last_step
    path = os.environ.get(ENV_PROGRESS_FILE)
    if not path:
        return
    _last_step = int(step)
    if loss is None and _pending:
        loss = sum(float(x) for x in _pending) / len(_pending)
    _pending.clear()
    record = {"step": int(step), "samples": int(samples), "time": round(time.time(), 3)}
    if loss is not None:
        record["loss"] = float(loss) if math.isfinite(float(loss)) else str(float(loss))
    with open(path, "a", encoding="utf-8") as f:  # one short append per step: cheap, and whole lines
        f.write(json.dumps(record) + "\n")


class ProgressReader:
    """The agent's side: what a script appended to ``path`` since the last :meth:`take`."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path, self._offset, self.step = path, 0, 0

    def take(self) -> tuple[float | None, int, int]:
        """``(mean loss or None, samples, latest step or 0)`` of the lines appended since the last call
        (None: no loss reported; a reported NaN is NaN)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return None, 0, 0
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        losses, samples, step = [], 0, 0
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
                samples += int(rec.get("samples", 0))
                step = max(step, int(rec["step"]))
                if "loss" in rec:
                    losses.append(float(rec["loss"]))
            except (ValueError, KeyError, TypeError):
                continue  # not a progress line: ignored
        self.step = max(self.step, step)
        return (sum(losses) / len(losses) if losses else None), samples, step


__all__ = ["ENV_PROGRESS_FILE", "ProgressReader", "active", "last_step", "note_loss", "report", "report_loss",
           "restored", "restored_step"]
