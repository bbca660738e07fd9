"""A worker's checkpoint files: their names, and a write that fails saying which file and why.

Rank 0 writes them (blocking ones from the trainer, persisted in-memory snapshots from the flash
writer thread) into ``JOBDIR/checkpoints``: ``ckpt-<version>.ckpt`` (nine digits, so that names sort
by step) and ``final.ckpt``. The master's checkpoint store reads the same names.
"""

from __future__ import annotations

from pathlib import Path

from flextrain.durable import write_atomic


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (e.g. no space left on the device); the message names it."""


def checkpoint_path(directory: Path, version: int, *, final: bool = False) -> Path:
    """Where the checkpoint of step ``version`` goes (``final``: the one a finished job ends with)."""
    return Path(directory) / ("final.ckpt" if final else f"ckpt-{version:09d}.ckpt")


def write_checkpoint(path: Path, blob: bytes | bytearray | memoryview) -> None:
    """Write ``blob`` to ``path`` atomically (a reader never sees half a checkpoint), making its
    directory first. On failure (e.g. a full disk) nothing is left behind, the previous checkpoint
    stays the latest, and :class:`CheckpointWriteError` names the file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, blob)
    except OSError as exc:
        raise CheckpointWriteError(f"cannot write checkpoint {path}: {exc.strerror or exc}; the previous "
                                   "checkpoint is kept") from exc
