"""``State``: what an elastic script commits and gets back after its processes are re-formed.

A script job's processes are restarted whenever the world changes (a worker
died, joined or left; flextrain/worker/script_agent.py), so a script keeps
what it must not lose in a ``State`` — as Horovod elastic's and torchelastic's
scripts do::

    state = State(model=model, optimizer=optimizer, epoch=0, step=0)
    state.restore()                      # the latest commit, if there is one
    while state.step < total_steps:
        ...train one step...
        state.step += 1
        if state.step % 10 == 0:
            state.commit()

Keyword arguments with ``state_dict``/``load_state_dict`` (models, optimizers,
schedulers, DDP wrappers) are saved by their state dicts and loaded back in
place; any other keyword is a plain value (int, float, str, bool, None, or
tensors and lists/dicts of them) read and set as an attribute.

:meth:`commit` writes one file, ``state.pt``, in the state directory
(``$FLEXTRAIN_STATE_DIR``, which the agent sets to ``JOB_DIR/state``; else
``./flextrain-state``), atomically: a temp file, fsync, rename, fsync of the
directory, so a process killed mid-commit leaves the previous commit. Only
rank 0 writes; when a process group is initialised every rank waits on a
barrier, so no rank runs ahead of a commit that is not there yet. Beside it,
``state.json`` records the commit number (``{"commit": n}``); the agent
reports it to the master as the job's step. A commit also records the step
last reported to the job's history (flextrain.elastic.progress), so the
wrappers that count steps continue from it after a restore.

:meth:`restore` loads with ``torch.load(weights_only=True)``: tensors and
plain containers only, never arbitrary pickled objects; the file lives on the
job's own volume and never crosses the network.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

from flextrain.durable import write_atomic
from flextrain.elastic import progress

ENV_STATE_DIR = "FLEXTRAIN_STATE_DIR"
STATE_FILE = "state.pt"
COMMIT_FILE = "state.json"
DEFAULT_DIR = "flextrain-state"


class State:
    """Objects and values a script commits and restores (see the module docstring)."""

    def __init__(self, *, directory: str | os.PathLike | None = None, **objects: Any) -> None:
        stateful = {k: v for k, v in objects.items() if _stateful(v)}
        values = {k: v for k, v in objects.items() if k not in stateful}
        object.__setattr__(self, "_objects", stateful)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "directory", Path(directory or os.environ.get(ENV_STATE_DIR) or DEFAULT_DIR))
        object.__setattr__(self, "commits", 0)  # commits made by this job so far (restored with the state)

    # ---- plain values as attributes -------------------------------------------
    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        objects = object.__getattribute__(self, "_objects")
        if name in values:
            return values[name]
        if name in objects:
            return objects[name]
        raise AttributeError(f"State has no {name!r} (given: {', '.join([*objects, *values]) or 'nothing'})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._objects:
            raise AttributeError(f"State.{name} holds an object; change it in place, not by assignment")
        if name not in self._values:
            raise AttributeError(f"State has no value {name!r}: pass it to State(...) so it is committed")
        self._values[name] = value

    # ---- commit / restore -----------------------------------------------------
    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    def commit(self) -> None:
        """Save every object's state dict and every value (rank 0 writes; every rank waits for it)."""
        import torch

        number = self.commits + 1
        if _rank() == 0:
            payload = {"commit": number, "values": dict(self._values), "progress_step": progress.last_step(),
                       "objects": {name: obj.state_dict() for name, obj in self._objects.items()}}
            buffer = io.BytesIO()
            torch.save(payload, buffer)
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, buffer.getvalue())
            write_atomic(self.directory / COMMIT_FILE, json.dumps({"commit": number}).encode())
        object.__setattr__(self, "commits", number)
        _barrier()

    def restore(self) -> bool:
        """Load the latest commit into the objects and values; False when there is none yet."""
        import torch

        if not self.path.exists():
            return False
        payload = torch.load(self.path, map_location="cpu", weights_only=True)
        for name, obj in self._objects.items():
            if name not in payload["objects"]:
                raise KeyError(f"{self.path} holds no state for {name!r} (it has: "
                               f"{', '.join(payload['objects']) or 'nothing'})")
            obj.load_state_dict(payload["objects"][name])
        self._values.update({k: v for k, v in payload["values"].items() if k in self._values})
        object.__setattr__(self, "commits", int(payload["commit"]))
        progress.restored(int(payload.get("progress_step", 0)))  # the job's step count continues from there
        return True


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()




__all__ = ["COMMIT_FILE", "ENV_STATE_DIR", "STATE_FILE", "State"]
