"""In-memory ("flash") checkpoints: the job's snapshots in host shared memory.

Every ``--memory-checkpoint-steps`` steps an AllReduce round's rank 0 copies
model + optimizer state (the :mod:`flextrain.elastic.statecodec` bytes) into
a directory of the job in shared memory (``/dev/shm/flextrain-<job>-<hash of
the job directory>``; ``FLEXTRAIN_FLASH_DIR`` overrides ``/dev/shm``). It
outlives the worker process: when every worker dies, the master (same host),
or a ``--resume`` of the job after the master died too, persists the newest
snapshot before it restores.

A snapshot of version ``v`` is two files, each written whole (temp file,
rename):

* ``state-<v>.ckpt`` — the state bytes (rank 0's copy, written by its flash writer thread);
* ``ledger-<v>.json`` — ``{"version", "position", "ledger", "size", "crc32"}``:
  the master's ledger state that belongs to exactly that model (the answer to
  the snapshot's mark), the state's length and CRC-32, with a CRC-32 over the
  JSON itself. Written after the state, so a ledger file always names a
  complete state file of the same snapshot.

Only a snapshot with both files, whose state passes its checks, is usable
(:meth:`FlashStore.latest`). Nothing here is unpickled: state is statecodec,
the rest JSON. The master removes the directory when the job ends.
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
from dataclasses import dataclass
from pathlib import Path

from flextrain.elastic.statecodec import StateCodecError, verify

ENV_ROOT = "FLEXTRAIN_FLASH_DIR"
_STATE = re.compile(r"^state-(\d{9})\.ckpt$")


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


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Snapshot:
    version: int
    state_path: Path
    ledger: dict  # the master's ledger state at exactly this model
    position: dict  # round_id, task_index, steps_done, version


class FlashStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def state_path(self, version: int) -> Path:
        return self.path / f"state-{version:09d}.ckpt"

    def ledger_path(self, version: int) -> Path:
        return self.path / f"ledger-{version:09d}.json"

    def _write(self, path: Path, data: bytes) -> None:
        """Whole or not at all (memory: no fsync); a temp name no other writer uses."""
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_state(self, version: int, blob: bytes) -> None:
        """The state bytes into shared memory (before the snapshot's mark)."""
        self._write(self.state_path(version), blob)

    def put_ledger(self, version: int, blob: bytes, *, ledger: dict, position: dict) -> None:
        """Complete snapshot ``version`` (its state already written) with its ledger; older snapshots go."""
        data = {"version": version, "position": position, "ledger": ledger, "size": len(blob),
                "crc32": zlib.crc32(blob)}
        data["check"] = zlib.crc32(_canonical(data))
        self._write(self.ledger_path(version), json.dumps(data).encode())
        self.prune(below=version)

    def versions(self) -> list[int]:
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _STATE.match(n)))

    def latest(self, *, above: int = -1) -> tuple[Snapshot | None, list[str]]:
        """The newest complete snapshot newer than ``above`` and the damaged or incomplete ones skipped
        (one line each, naming the file)."""
        skipped: list[str] = []
        for version in reversed(self.versions()):
            if version <= above:
                break
            try:
                return self._read(version), skipped
            except FileNotFoundError:
                skipped.append(f"{self.state_path(version)}: no ledger (its mark was never answered)")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                skipped.append(f"{self.state_path(version)}: {exc}")
        return None, skipped

    def _read(self, version: int) -> Snapshot:
        meta = json.loads(self.ledger_path(version).read_bytes())
        if not isinstance(meta, dict):
            raise ValueError("its ledger file is not a JSON object")
        check = meta.pop("check", None)
        if check != zlib.crc32(_canonical(meta)):
            raise ValueError("its ledger file fails its checksum")
        if meta["version"] != version:
            raise ValueError(f"its ledger file is of version {meta['version']}")
        blob = self.state_path(version).read_bytes()
        if len(blob) != meta["size"] or zlib.crc32(blob) != meta["crc32"]:
            raise ValueError("the state is not the one its ledger was taken for")
        try:
            verify(blob)
        except StateCodecError as exc:
            raise ValueError(str(exc)) from exc
        return Snapshot(version, self.state_path(version), meta["ledger"], meta["position"])

    def prune(self, *, below: int) -> None:
        """Remove every snapshot older than ``below`` (and writers' leftover temp files of them)."""
        for version in self.versions():
            if version < below:
                self.ledger_path(version).unlink(missing_ok=True)
                self.state_path(version).unlink(missing_ok=True)

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


__all__ = ["ENV_ROOT", "FlashStore", "Snapshot", "flash_dir", "flash_root"]
