"""Where a job's checkpoints are, and the ledger state that goes with each.

A round's rank 0 writes model + optimizer state (``ckpt-<version>.ckpt``,
``final.ckpt``); the master, told the exact position the state corresponds
to, writes the matching ledger snapshot (``ledger-<version>.json``) and then
``latest.json`` naming both. Resuming reads ``latest.json``: model state and
data position come from the same instant, so every record is applied once.
Older pairs are pruned, keeping the newest ``keep``.

Every file here is checked before it is used: the ledger files and
``latest.json`` carry a CRC-32 (``"crc32"``, over the canonical JSON of the
other fields; files without one, from older versions, are read as they are),
a ledger must be consistent with the job's data (``TaskLedger.check_state``)
and a checkpoint blob must pass its own checksum
(:func:`flextrain.elastic.statecodec.verify`). :meth:`CheckpointStore.resume_point`
goes from the newest pair to older ones, naming each damaged file it skips;
with none left it raises :class:`CheckpointError` naming them all. Files are
written atomically (temp file, fsync, rename, fsync of the directory); a
failed write (e.g. a full disk) removes its temp file and leaves the
previous file as it was.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import zlib
from pathlib import Path
from typing import Callable

from flextrain.durable import write_atomic

CHECKSUM_KEY = "crc32"


class StateFileError(ValueError):
    """A state file fails its check (unreadable, truncated, checksum, inconsistent); the message names it."""


class StateWriteError(OSError):
    """A state file could not be written (e.g. no space left); the old file, if any, is unchanged."""

    def __str__(self) -> str:
        return str(self.args[1]) if len(self.args) > 1 else super().__str__()


class CheckpointError(RuntimeError):
    """No checkpoint of the directory passes its checks; the message names the files that failed."""


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def write_bytes_atomic(path: Path, data: bytes | str) -> None:
    """Write a file so that readers see the old one or the new one, never half of one.

    Temp file in the same directory, fsync, rename over ``path``, fsync of the
    directory. On any failure the temp file is removed and ``path`` is left as it
    was; an OSError (a full disk, ...) becomes a :class:`StateWriteError` naming the
    path and the reason."""
    path = Path(path)
    try:
        write_atomic(path, data.encode() if isinstance(data, str) else data)
    except OSError as exc:
        if isinstance(exc, StateWriteError):
            raise
        code = exc.errno or errno.EIO
        reason = exc.strerror or os.strerror(code)
        raise StateWriteError(code, f"cannot write {path}: {reason}"
                              + ("; the previous file is kept" if path.exists() else "")) from exc


def write_json_atomic(path: Path, data: dict, *, checksum: bool = False) -> None:
    """Write JSON atomically (:func:`write_bytes_atomic`); with ``checksum``, add a ``"crc32"`` field
    that :func:`read_json_checked` verifies."""
    if checksum:
        data = {**data, CHECKSUM_KEY: zlib.crc32(_canonical(data))}
    write_bytes_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")


def _read(path: Path) -> bytes:
    """The file's bytes; FileNotFoundError passes, any other OSError is a StateFileError naming it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StateFileError(f"{path}: cannot read it ({exc.strerror or exc})") from exc


def read_json_checked(path: Path) -> dict:
    """A JSON object written by :func:`write_json_atomic`, its checksum (when it has one) verified.

    FileNotFoundError passes; anything else wrong raises :class:`StateFileError` naming the file."""
    path = Path(path)
    text = _read(path)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateFileError(f"{path}: not valid JSON ({exc}): the file is truncated or damaged") from exc
    if not isinstance(data, dict):
        raise StateFileError(f"{path}: not a JSON object: the file is damaged")
    if CHECKSUM_KEY in data:
        stored = data.pop(CHECKSUM_KEY)
        actual = zlib.crc32(_canonical(data))
        if stored != actual:
            raise StateFileError(f"{path}: checksum mismatch (CRC-32 {actual}, stored {stored}): "
                                 "the file was changed after it was written")
    return data


def _first_usable(candidates, use: Callable, damaged: list[str], *, name: Callable = lambda c: c):
    """``use(c)`` of the first candidate it accepts, newest first; each it refuses (a missing
    file, a :class:`StateFileError`) adds a line naming it to ``damaged``. None if none passes."""
    for candidate in candidates:
        try:
            return use(candidate)
        except FileNotFoundError as exc:
            damaged.append(f"{exc.filename or name(candidate)}: missing")
        except StateFileError as exc:
            damaged.append(str(exc))
    return None


class CheckpointStore:
    def __init__(self, directory: Path, *, keep: int = 2) -> None:
        self.directory = Path(directory)
        self.keep = keep
        # One writer at a time: periodic checkpoints are recorded outside the job's lock (JobMaster), so
        # two reports, or a report and a flush of an in-memory snapshot, may arrive together.
        self.lock = threading.RLock()
        self.recorded = -1  # the newest version recorded through this store

    @property
    def latest_path(self) -> Path:
        return self.directory / "latest.json"

    def record(self, *, checkpoint: str, version: int, ledger: dict, final: bool, newer_only: bool = False) -> bool:
        """Write the ledger file of a checkpoint, then ``latest.json`` naming both; raises
        :class:`StateWriteError` (previous files kept) when a write fails. ``newer_only``: nothing is
        written (False returned) unless ``version`` is newer than every one recorded here."""
        with self.lock:
            if newer_only and version <= self.recorded:
                return False
            self._record(checkpoint=checkpoint, version=version, ledger=ledger, final=final)
            self.recorded = max(self.recorded, version)
            return True

    def _record(self, *, checkpoint: str, version: int, ledger: dict, final: bool) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        ledger_path = self.directory / f"ledger-{version:09d}.json"
        # Names, not paths: a moved or copied job directory resumes from its own files.
        entry = {"checkpoint": Path(checkpoint).name, "version": version, "final": final}
        # The ledger file (the ledger's state fields) names its checkpoint too: an older pair is
        # usable without latest.json.
        write_json_atomic(ledger_path, {**ledger, **entry}, checksum=True)
        write_json_atomic(self.latest_path, {**entry, "ledger": ledger_path.name}, checksum=True)
        self._prune()

    def adopt_flash(self, flash, *, note: Callable[[str], None] = lambda text: None) -> int | None:
        """Persist the newest complete in-memory snapshot of ``flash`` (a
        :class:`flextrain.elastic.flash.FlashStore`) newer than the newest checkpoint here: its state as
        ``ckpt-<version>.ckpt``, recorded with the ledger it was taken with. Returns its version, or None
        when there was none newer. Damaged or incomplete snapshots skipped are passed to ``note``.
        Raises :class:`StateWriteError` when a write fails (the previous checkpoint stays the latest)."""
        with self.lock:
            latest = self.latest()
            snapshot, skipped = flash.latest(above=latest["version"] if latest else -1)
            if skipped:
                note("in-memory checkpoints skipped: " + "; ".join(skipped))
            if snapshot is None:
                return None
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"ckpt-{snapshot.version:09d}.ckpt"
            write_bytes_atomic(path, snapshot.state_path.read_bytes())
            self.record(checkpoint=str(path), version=snapshot.version, ledger=snapshot.ledger, final=False)
            return snapshot.version

    def latest(self) -> dict | None:
        """``{"checkpoint", "version", "final", "ledger": <state dict>}`` or None: the newest pair whose
        JSON files pass their checksums (the blob is not read: see :meth:`resume_point`)."""
        try:
            entry, _ = self.resume_point(verify_blobs=False)
        except CheckpointError:
            return None
        return entry

    def resume_point(self, *, check: Callable[[dict], None] | None = None,
                     verify_blobs: bool = True) -> tuple[dict | None, list[str]]:
        """The newest consistent checkpoint and the damaged ones skipped on the way to it.

        ``(entry, damaged)``: ``entry`` as :meth:`latest` (None when the directory holds no
        checkpoint at all), ``damaged`` one line per file that failed its check, naming it.
        ``check`` is the ledger's consistency check (``TaskLedger.check_state``); with
        ``verify_blobs`` the checkpoint's bytes are read and their checksum verified. Raises
        :class:`CheckpointError`, naming every damaged file, when checkpoints exist but none passes.
        """
        damaged: list[str] = []
        candidates: list[tuple[Path, dict | None]] = []  # (ledger file, latest.json's fields)
        try:
            meta = read_json_checked(self.latest_path)
            candidates.append((self._here(meta["ledger"]), meta))
        except FileNotFoundError:
            pass
        except StateFileError as exc:
            damaged.append(str(exc))
        except (KeyError, TypeError) as exc:
            damaged.append(f"{self.latest_path}: no valid ledger field ({exc!r}): the file is damaged")
        listed = {path for path, _ in candidates}
        candidates += [(p, None) for p in sorted(self.directory.glob("ledger-*.json"), reverse=True)
                       if p not in listed]

        def usable(candidate: tuple[Path, dict | None]) -> dict:
            ledger_path, meta = candidate
            entry = self._entry(ledger_path, meta)
            if check is not None:
                try:
                    check(entry["ledger"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise StateFileError(f"{ledger_path}: inconsistent ledger: {exc}") from exc
            if verify_blobs:
                self._verify_blob(Path(entry["checkpoint"]))
            return entry

        entry = _first_usable(candidates, usable, damaged, name=lambda candidate: candidate[0])
        if entry is not None:
            return entry, damaged
        if damaged:
            raise CheckpointError(f"no usable checkpoint in {self.directory}: " + "; ".join(damaged))
        return None, []

    def newest_model(self) -> tuple[Path | None, list[str]]:
        """``(checkpoint, damaged)``: the newest checkpoint file that passes its checksum (what
        evaluation needs: no ledger) and a line per damaged one skipped on the way; None if none passes."""
        named: list[Path] = []
        try:
            named.append(self._here(read_json_checked(self.latest_path)["checkpoint"]))
        except (OSError, StateFileError, KeyError, TypeError):
            pass  # latest.json is a pointer: the files themselves are what is checked
        damaged: list[str] = []
        candidates = dict.fromkeys([*named, *sorted(self.directory.glob("ckpt-*.ckpt"), reverse=True)])

        def verified(path: Path) -> Path:
            self._verify_blob(path)
            return path

        return _first_usable(candidates, verified, damaged), damaged

    def _here(self, name: str) -> Path:
        """A file named in latest.json or a ledger file: always the one in this directory (older
        versions stored absolute paths, which in a moved or copied directory name another job's)."""
        return self.directory / Path(name).name

    def _entry(self, ledger_path: Path, meta: dict | None) -> dict:
        data = read_json_checked(ledger_path)
        try:
            if "checkpoint" in data:  # the ledger's fields and "checkpoint", "version", "final"
                entry = {"checkpoint": str(data.pop("checkpoint")), "version": int(data.pop("version")),
                         "final": bool(data.pop("final")), "ledger": data}
            elif meta is not None:  # an older version's ledger file: the state alone, latest.json names the rest
                entry = {**meta, "ledger": data}
            else:  # an older version's ledger file that latest.json no longer names
                version = int(ledger_path.stem.removeprefix("ledger-"))
                entry = {"checkpoint": str(self.directory / f"ckpt-{version:09d}.ckpt"), "version": version,
                         "final": False, "ledger": data}
        except (KeyError, TypeError, ValueError) as exc:
            raise StateFileError(f"{ledger_path}: missing or invalid field ({exc!r}): the file is damaged") from exc
        entry["checkpoint"] = str(self._here(entry["checkpoint"]))
        return entry

    @staticmethod
    def _verify_blob(path: Path) -> None:
        from flextrain.elastic.statecodec import StateCodecError, verify

        data = _read(path)
        try:
            verify(data)
        except StateCodecError as exc:
            raise StateFileError(f"{path}: {exc}") from exc

    def _prune(self) -> None:
        for pattern in ("ckpt-*.ckpt", "ledger-*.json"):
            for old in sorted(self.directory.glob(pattern))[: -self.keep]:
                old.unlink(missing_ok=True)
