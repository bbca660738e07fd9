"""In-memory ("flash") checkpoints: the job's snapshots in host shared memory.

Every ``--memory-checkpoint-steps`` steps an AllReduce round's rank 0 copies
model + optimizer state (the :mod:`flextrain.elastic.statecodec` bytes) into
a directory of the job in shared memory (``/dev/shm/flextrain-<job>-<hash of
the job directory>``; ``FLEXTRAIN_FLASH_DIR`` overrides ``/dev/shm``). It
outlives the worker process: when every worker dies, the master (same host),
or a ``--resume`` of the job after the master died too, persists the newest
snapshot before it restores.

A snapshot is named after its exact position, ``<stem>`` =
``<version:09d>-<round>-<task index>-<steps done>``, and is two files, each
written whole (temp file, rename):

* ``state-<stem>.ckpt`` — the state bytes (rank 0's flash writer thread; no
  RPC: the name is all the master needs to place it);
* ``ledger-<stem>.json`` — ``{"version", "position", "ledger", "size"}``: the
  master's ledger state that belongs to exactly that model, and the state's
  length, with a CRC-32 over the JSON itself. The master writes it
  (:meth:`FlashStore.put_ledger`) when it resolves the snapshot
  (``master/checkpoint_reports.py``: before its ledger records an outcome the
  snapshot's model may lack); a snapshot the ledger has moved past is
  removed instead (:meth:`FlashStore.discard`).

Only a snapshot with both files, whose state passes its checks (statecodec's
own checksum), is usable (:meth:`FlashStore.latest`). Nothing here is
unpickled: state is statecodec, the rest JSON. The master removes the
directory when the job ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path


ENV_ROOT = "FLEXTRAIN_FLASH_DIR"
_STATE = re.compile(r"^state-((\d{9})-(-?\d+)-(\d+)-(\d+))\.ckpt$")
_LEDGER = re.compile(r"^ledger-(\d{9}-[-\d]+)\.json$")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


def flash_root() -> Path:
    """Where the jobs' flash directories are: ``$FLEXTRAIN_FLASH_DIR``, else /dev/shm (a tmpfs), else
    the temp directory."""
    given = os.environ.get(ENV_ROOT)
    if given:
        return Path(given)
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def flash_dir(job_name: str, job_dir: str | Path) -> Path:
    """The job's flash directory: named after the job, and its directory (two jobs of one name differ)."""
    digest = hashlib.sha1(str(Path(job_dir).resolve()).encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)[:64]
    return flash_root() / f"flextrain-{safe}-{digest}"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def stem(position) -> str:
    """A snapshot's name part from its position (a ``pb.Position`` or its dict)."""
    if isinstance(position, dict):
        return f"{position['version']:09d}-{position['round_id']}-{position['task_index']}-{position['steps_done']}"
    return f"{position.version:09d}-{position.round_id}-{position.task_index}-{position.steps_done}"


@dataclass(frozen=True)
class Snapshot:
    version: int
    state_path: Path
    ledger: dict  # the master's ledger state at exactly this model
    position: dict  # round_id, task_index, steps_done, version


@dataclass(frozen=True)
class Pending:
    """A snapshot's state in shared memory that the master has not resolved yet (no ledger file)."""
    state_path: Path
    position: dict  # round_id, task_index, steps_done, version
    # the listing that found it (FlashStore._names): put_ledger's prune reads it instead of listing again
    listed: tuple = field(default=None, compare=False, repr=False)

    @property
    def version(self) -> int:
        return self.position["version"]


class FlashStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _state(self, name: str) -> Path:
        return self.path / f"state-{name}.ckpt"

    def _ledger(self, name: str) -> Path:
        return self.path / f"ledger-{name}.json"

    def _write(self, path: Path | str, data: bytes) -> None:
        """Whole or not at all (memory: no fsync); a temp name no other writer uses. The directory is
        made when a write finds it missing (not checked before each write: several a second). Plain
        ``os`` calls: no file object is built for one write (this runs for every snapshot)."""
        base = str(self.path)
        tmp = f"{base}/.{os.path.basename(path)}.{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            try:
                fd = os.open(tmp, _CREATE, 0o666)
            except FileNotFoundError:
                self.path.mkdir(parents=True, exist_ok=True)
                fd = os.open(tmp, _CREATE, 0o666)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise

    def put_state(self, blob: bytes, position) -> None:
        """The state bytes of the snapshot at ``position`` into shared memory (rank 0's writer)."""
        self._write(f"{self.path}/state-{stem(position)}.ckpt", blob)

    def _names(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        """(state stem -> (version, round, task index, steps done), ledger stems)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return {}, set()
        states, ledgers = {}, set()
        for name in names:
            if m := _STATE.match(name):
                states[m.group(1)] = tuple(int(g) for g in m.groups()[1:])
            elif m := _LEDGER.match(name):
                ledgers.add(m.group(1))
        return states, ledgers

    def pending(self) -> list[Pending]:
        """Snapshots without a ledger yet, newest first (one ``listdir``: the master calls it often)."""
        listed = states, ledgers = self._names()
        if states.keys() <= ledgers:  # the usual answer: nothing new
            return []
        return [Pending(self._state(s), dict(zip(("version", "round_id", "task_index", "steps_done"), key)),
                        listed)
                for s, key in sorted(states.items(), key=lambda item: item[1], reverse=True) if s not in ledgers]

    def put_ledger(self, pending: Pending, ledger: dict) -> None:
        """Complete ``pending`` with its ledger (the master); every older snapshot goes (those of the
        listing that found ``pending``: an older one put meanwhile goes with the next)."""
        data = _canonical({"version": pending.version, "position": pending.position, "ledger": ledger,
                           "size": os.stat(pending.state_path).st_size})
        # the canonical JSON with "check" added, encoded once: "check" sorts before every other key
        self._write(f"{self.path}/ledger-{stem(pending.position)}.json",
                    b'{"check":%d,%s' % (zlib.crc32(data), data[1:]))
        self.prune(below=pending.version, listed=pending.listed)

    def discard(self, pending: Pending) -> None:
        """A snapshot that can never be complete (the ledger moved past it)."""
        pending.state_path.unlink(missing_ok=True)

    def versions(self) -> list[int]:
        return sorted(key[0] for key in self._names()[0].values())

    def latest(self, *, above: int = -1) -> tuple[Snapshot | None, list[str]]:
        """The newest complete snapshot newer than ``above`` and the damaged or incomplete ones skipped
        (one line each, naming the file)."""
        skipped: list[str] = []
        states, ledgers = self._names()
        for name, key in sorted(states.items(), key=lambda item: item[1], reverse=True):
            if key[0] <= above:
                break
            if name not in ledgers:
                skipped.append(f"{self._state(name)}: no ledger (the master never resolved it)")
                continue
            try:
                return self._read(name, key[0]), skipped
            except (OSError, ValueError, KeyError, TypeError) as exc:
                skipped.append(f"{self._state(name)}: {exc}")
        return None, skipped

    def _read(self, name: str, version: int) -> Snapshot:
        meta = json.loads(self._ledger(name).read_bytes())
        if not isinstance(meta, dict):
            raise ValueError("its ledger file is not a JSON object")
        check = meta.pop("check", None)
        if check != zlib.crc32(_canonical(meta)):
            raise ValueError("its ledger file fails its checksum")
        if meta["version"] != version:
            raise ValueError(f"its ledger file is of version {meta['version']}")
        blob = self._state(name).read_bytes()
        if len(blob) != meta["size"]:
            raise ValueError("the state is not the one its ledger was taken for")
        from flextrain.elastic.statecodec import StateCodecError, verify  # torch: only when a snapshot is read

        try:
            verify(blob)
        except StateCodecError as exc:
            raise ValueError(str(exc)) from exc
        return Snapshot(version, self._state(name), meta["ledger"], meta["position"])

    def prune(self, *, below: int, listed: tuple | None = None) -> None:
        """Remove every snapshot older than ``below`` (of ``listed``, a :meth:`_names` listing taken
        since the last write of a ledger; else of one taken now)."""
        states, ledgers = listed if listed is not None else self._names()
        base = str(self.path)  # plain strings: the master prunes after every snapshot it resolves
        for name, key in states.items():
            if key[0] < below:
                if name in ledgers:
                    _unlink(f"{base}/ledger-{name}.json")
                _unlink(f"{base}/state-{name}.ckpt")
        for name in ledgers - states.keys():  # a ledger whose state went
            _unlink(f"{base}/ledger-{name}.json")

    def clear(self) -> None:
        """Remove every snapshot (the directory stays)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        for name in names:
            (self.path / name).unlink(missing_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


__all__ = ["ENV_ROOT", "FlashStore", "Pending", "Snapshot", "flash_dir", "flash_root", "stem"]
