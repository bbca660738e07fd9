"""Durable, atomic file writes: shared by the master's state files, the workers' checkpoints and
the elastic APIs' state files."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. a platform without directory fds: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Write ``path`` so that readers see the old file or the new one, never half of one, and so that
    the new one survives a crash once this returns: a temp file in the same directory (a name no
    other process or thread uses), fsync, rename over ``path``, fsync of the directory. On any
    failure the temp file is removed, ``path`` is left as it was, and the exception propagates."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
