"""Who may use a job directory: the guard, the lock and moving old state aside.

Contract:

* :func:`guard` runs at submission, before anything is written. It refuses
  (:class:`JobDirError`, which the CLI prints as one ``flextrain: error:`` line,
  exit 2) a path that is not a usable directory (a file, under a file, not
  writable, no space left), a directory whose lock a live master holds (naming
  its pid and host), and a new run in a directory that holds a job (running,
  stopped, failed or finished) unless ``resume`` or ``overwrite`` says what to do.
* :class:`JobDirLock` is an exclusive ``flock`` on ``<job_dir>/.lock``, held by
  the master for its lifetime (the fd is not inherited by workers). The kernel
  drops it when the master dies, so a crashed master never blocks a resume; a
  lock file left behind means nothing by itself.
* :func:`move_aside` moves everything in the directory but the lock, earlier
  ``previous-*`` and the new job's own inputs into ``<job_dir>/previous-<time>/``:
  a new run never deletes or overwrites an old one's checkpoints, logs or status.
  The master does it for any run that does not resume in a directory holding a
  job (the CLI lets it get there only with ``--overwrite``; a first Kubernetes
  master does it for a directory an older job of the same name left behind).
* :func:`inspect` says what is there (phase, step, last checkpoint), naming any
  file it cannot read instead of failing.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCK_NAME = ".lock"
PREVIOUS_PREFIX = "previous-"
# Any of these means a job (of any phase) lives here.
JOB_FILES = ("jobspec.json", "status.json", "checkpoints/latest.json", "ps-ledger.json")


class JobDirError(Exception):
    """The job directory cannot be used as asked; the message is one line for the user."""


@dataclass
class JobDirInfo:
    path: Path
    holds_job: bool = False
    phase: str | None = None
    step: int | None = None
    checkpoint: str | None = None
    final: bool = False
    damaged: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"phase {self.phase or 'unknown'}", f"step {self.step if self.step is not None else 'unknown'}"]
        if self.checkpoint:
            parts.append(f"last checkpoint {self.checkpoint}" + (" (final)" if self.final else ""))
        else:
            parts.append("no checkpoint")
        if self.damaged:
            parts.append(f"unreadable: {', '.join(self.damaged)}")
        return ", ".join(parts)


def _read_json(path: Path, info: JobDirInfo) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        info.damaged.append(str(path))
        return None
    return data


def inspect(job_dir: str | Path) -> JobDirInfo:
    """What a job directory holds; damaged files are named in ``damaged``, never raised."""
    root = Path(job_dir)
    info = JobDirInfo(root)
    if not root.is_dir():
        return info
    ps_state = root / "ps-checkpoints"
    info.holds_job = (any((root / name).exists() for name in JOB_FILES)
                      or (ps_state.is_dir() and any(ps_state.iterdir())))
    status = _read_json(root / "status.json", info) or {}
    info.phase = status.get("phase") if isinstance(status.get("phase"), str) else None
    info.step = status.get("step") if isinstance(status.get("step"), int) else None
    latest = _read_json(root / "checkpoints" / "latest.json", info)
    if latest is not None:
        name = latest.get("checkpoint")  # a name (older versions: a path) in checkpoints/
        info.checkpoint = str(root / "checkpoints" / Path(name).name) if isinstance(name, str) else None
        info.final = bool(latest.get("final"))
        if info.step is None and isinstance(latest.get("version"), int):
            info.step = latest["version"]
    elif ps_state.is_dir() and any(ps_state.iterdir()):  # PS mode: the model is the PS checkpoints
        info.checkpoint = str(ps_state)
        ledger = _read_json(root / "ps-ledger.json", info)
        info.final = bool(ledger and ledger.get("training_finished"))
    return info


def _who(fd: int) -> str:
    words = os.pread(fd, 256, 0).decode(errors="replace").split()
    return f"pid {words[0]} on host {words[1]}" if len(words) >= 2 else "a process that has not said who"


def finished_message(root: str | Path, epochs: int, checkpoint: str, *, model_def: str = "",
                     validation: str | None = None) -> str:
    """Why a resume of a job that finished training has nothing to do, and how to train more (and, given the
    job's module and validation data, how to evaluate its final model: e.g. after its final evaluation failed)."""
    evaluate = (f"; `flextrain evaluate --checkpoint {root} --model-def {model_def} --validation-data {validation}` "
                "evaluates its final model") if model_def and validation else ""
    return (f"{root} already finished training its {epochs} epoch(s) (final checkpoint {checkpoint}); "
            f"`flextrain train --resume {root} --epochs N` with N > {epochs} trains more{evaluate}")


def _in_use(path: Path, who: str) -> JobDirError:
    return JobDirError(f"job directory {path} is in use by a running master ({who}); "
                       f"stop it with `flextrain stop {path}` or choose another --job-dir")


def holder(job_dir: str | Path) -> str | None:
    """``"pid N on host H"`` when a live process holds the directory's lock, else None."""
    path = Path(job_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _who(fd)
        except OSError:  # a file system without flock: nothing to learn
            return None
        return None
    finally:
        os.close(fd)  # also drops our shared lock


def check_usable(job_dir: str | Path) -> None:
    """Refuse a path that is not, or cannot become, a writable directory with free space."""
    path = Path(job_dir)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"lies under {existing}, which is a file"
        raise JobDirError(f"job directory {path} {what}, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise JobDirError(f"job directory {path} {what} (permission denied)")
    try:
        st = os.statvfs(existing)
    except OSError:
        return
    if st.f_bavail * st.f_frsize == 0:
        raise JobDirError(f"job directory {path}: no space left on its device")


def guard(job_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
          resumable: bool = True) -> JobDirInfo:
    """Refuse what must not start in ``job_dir`` (module docstring); writes nothing.

    ``resumable`` False (evaluate, predict): the refusal offers no ``--resume``.
    """
    path = Path(job_dir)
    if resume and overwrite:
        raise JobDirError("--resume and --overwrite contradict each other: continue the job or start afresh, not both")
    check_usable(path)
    if (who := holder(path)) is not None:
        raise _in_use(path, who)
    info = inspect(path)
    if info.holds_job and not resume and not overwrite:
        if info.phase in ("Pending", "Running", "Suspended"):  # nobody holds the lock: its master died
            info.phase += " (its master is gone)"
        if not resumable:
            how = ""
        elif info.final:
            how = f"it finished training (`flextrain train --resume {path} --epochs N` trains more epochs); "
        else:
            how = f"resume with `flextrain train --resume {path}`; "
        raise JobDirError(f"job directory {path} already holds a job ({info.describe()}): {how}"
                          f"--overwrite starts afresh, moving the old state aside to {path}/{PREVIOUS_PREFIX}<time> "
                          "(nothing is deleted); or choose another --job-dir")
    return info


class JobDirLock:
    """An exclusive flock on ``<job_dir>/.lock`` naming its holder (pid and host)."""

    def __init__(self, job_dir: str | Path) -> None:
        self.job_dir = Path(job_dir)
        self.path = self.job_dir / LOCK_NAME
        self._fd: int | None = None
        self.supported = True

    def acquire(self, *, wait: float = 0.0) -> JobDirLock:
        """Take the lock, waiting up to ``wait`` seconds for a holder to go; JobDirError if it does not."""
        self.job_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                who = _who(fd)
                os.close(fd)
                raise _in_use(self.job_dir, who) from None
            except OSError as exc:  # ENOLCK, EOPNOTSUPP: a file system without locks; run unguarded
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise
                self.supported = False
                break
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # the kernel drops the lock with the last fd

    def __enter__(self) -> JobDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def move_aside(job_dir: str | Path, *, keep: tuple = ()) -> Path | None:
    """Move the directory's contents into ``previous-<time>/``; returns it, or None if nothing was moved.

    Stays: the lock, earlier ``previous-*`` and entries holding a path of ``keep``
    (the new job's inputs: data, checkpoint, output).
    """
    root = Path(job_dir)
    # data may be a comma-separated list or a glob: what matters is the fixed part of each path
    inputs = [Path(re.split(r"[*?\[]", part, maxsplit=1)[0] or ".").resolve()
              for k in keep if k for part in str(k).split(",") if part]

    def movable(entry: Path) -> bool:
        if entry.name == LOCK_NAME or entry.name.startswith(PREVIOUS_PREFIX):
            return False
        return not any(i == entry.resolve() or entry.resolve() in i.parents for i in inputs)

    entries = [p for p in root.iterdir() if movable(p)] if root.is_dir() else []
    if not entries:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = root / f"{PREVIOUS_PREFIX}{stamp}", 1
    while dest.exists():
        n += 1
        dest = root / f"{PREVIOUS_PREFIX}{stamp}-{n}"
    dest.mkdir()
    for entry in entries:
        entry.rename(dest / entry.name)
    return dest


__all__ = ["JobDirError", "JobDirInfo", "JobDirLock", "check_usable", "finished_message", "guard", "holder",
           "inspect", "move_aside"]
