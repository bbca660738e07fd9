"""PS shard checkpoints: ``<dir>/ps-<index>/version-<v>.ckpt``, atomic, last 2 kept; plus the write-ahead log.

A checkpoint holds what a relaunched PS needs to carry on: dense parameters
and their optimizer state, every embedding row with its optimizer state and
step count, the optimizer and sync settings, and the version. It is written
with :mod:`flextrain.elastic.statecodec` (JSON skeleton + raw tensors, no
pickle), to a temporary file that is fsynced and then renamed, so a PS killed
mid-write leaves the previous checkpoint intact.

Periodic checkpoints (every ``every`` versions) are taken on the thread that
bumped the version — serialising under the shard lock so the state is one
consistent version — and written to disk by a background thread, so training
pushes do not wait for the disk. If the writer is still busy, only the newest
pending snapshot is kept.

With ``wal=True`` (the default) the shard also keeps a write-ahead log in the
same directory (:mod:`flextrain.ps.wal`, written by its own thread with group
commit): each snapshot records the LSN of the last log record its state
includes (``wal_lsn``), :meth:`Checkpointer.restore` replays the records after
it (:mod:`flextrain.ps.walreplay`), and once a checkpoint is written the log
segments that only the checkpoints no longer kept needed are recycled. So a relaunched
PS comes back with every change it acknowledged, not just those up to its
last checkpoint — including SYNC gradients collected but not yet applied.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

from flextrain.elastic import statecodec
from flextrain.ps.state import ShardState, SyncSettings
from flextrain.ps.wal import WriteAheadLog
from flextrain.ps.walfiles import SEGMENT_BYTES, name_thread, segments
from flextrain.ps.walreplay import Replayed, replay

log = logging.getLogger(__name__)
_NAME = re.compile(r"^version-(\d+)\.ckpt$")


def checkpoint_files(directory: Path) -> list[tuple[int, Path]]:
    """(version, path) of the checkpoints in one shard's ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)))


def load_newest(shard: ShardState, directory: Path, *, keep_sync: SyncSettings | None = None,
                ) -> tuple[int | None, int]:
    """Load the newest readable checkpoint of ``directory`` into ``shard`` (writes nothing): ``(its version
    or None, the last write-ahead log record it includes: -1 for none named, 0 when nothing was loaded)``."""
    for version, path in reversed(checkpoint_files(directory)):
        try:
            tree = statecodec.decode(path.read_bytes())
            shard.load_state(tree, keep_sync=keep_sync)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping unreadable PS checkpoint %s: %s", path, exc)
            continue
        log.info("PS %d restored version %d from %s", shard.shard_index, version, path)
        return shard.version, int(tree.get("wal_lsn", -1))
    return None, 0


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, shard_index: int, *, every: int = 0, keep: int = 2,
                 wal: bool = True, wal_fsync: bool = False, wal_segment_bytes: int = SEGMENT_BYTES) -> None:
        if every < 0 or keep < 1:
            raise ValueError(f"checkpoint every must be >= 0 and keep >= 1 (got {every}, {keep})")
        self.dir = Path(directory) / f"ps-{shard_index}"
        self.every, self.keep = every, keep
        self.wal = WriteAheadLog(self.dir, fsync=wal_fsync, segment_bytes=wal_segment_bytes) if wal else None
        self._wal_kept: list[int] = []  # wal_lsn of the checkpoints on disk that this process knows, oldest first
        self._shard: ShardState | None = None
        self._cond = threading.Condition()
        self._pending: tuple[int, bytes] | None = None
        self._busy = False
        self._write_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ files

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(version, path) of the checkpoints on disk, oldest first."""
        return checkpoint_files(self.dir)

    def _write(self, version: int, blob: bytes, wal_lsn: int = -1) -> Path:
        if wal_lsn > 0 and self.wal is not None:
            # Everything in the snapshot is in the log (older segments) before the checkpoint
            # may replace those segments: the log is always at least as far as any checkpoint.
            self.wal.wait(wal_lsn)
        with self._write_lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            final = self.dir / f"version-{version}.ckpt"
            tmp = self.dir / f".version-{version}.ckpt.tmp-{os.getpid()}-{threading.get_ident()}"
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
                # Read back only by a restarted PS: free its pages for reuse (see SegmentFile.release)
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            os.replace(tmp, final)
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)  # make the rename itself durable
            finally:
                os.close(fd)
            for _, old in self.checkpoints()[: -self.keep]:
                old.unlink(missing_ok=True)
            if self.wal is not None and wal_lsn >= 0:
                self._wal_kept = (self._wal_kept + [wal_lsn])[-self.keep:]
                if len(self._wal_kept) == self.keep:  # the oldest kept checkpoint replays from there
                    self.wal.recycle(keep_after=self._wal_kept[0])
            log.info("PS checkpoint written: %s (%d bytes)", final, len(blob))
            return final

    # ------------------------------------------------------------------ saving

    def snapshot(self, shard: ShardState) -> tuple[int, bytes, int]:
        """(version, encoded state, wal_lsn), consistent: serialised while holding every shard lock;
        ``wal_lsn`` is the last log record the state includes (-1: no log). No file is touched here
        (the shard lock is held): the checkpoint is written once the log holds ``wal_lsn``."""
        with shard.locked():
            tree = shard.export_state()
            wal_lsn = -1
            if self.wal is not None and shard.wal is self.wal:
                tree["wal_lsn"] = wal_lsn = self.wal.appended
            return shard.version, statecodec.encode(tree), wal_lsn

    def save(self, shard: ShardState) -> tuple[Path, int]:
        """Write a checkpoint now (after any background write); returns (path, version)."""
        version, blob, wal_lsn = self.snapshot(shard)
        self.flush()
        return self._write(version, blob, wal_lsn), version

    def attach(self, shard: ShardState) -> None:
        """Checkpoint ``shard`` every ``every`` versions (no-op when every == 0)."""
        self._shard = shard
        if self.every:
            shard.on_version = self._on_version

    def _on_version(self, version: int) -> None:
        if version % self.every:
            return
        snap = self.snapshot(self._shard)
        if snap[0] % self.every:  # another update slipped in; the next multiple will be saved
            return
        with self._cond:
            self._pending = snap  # a newer snapshot replaces one still waiting for the disk
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="ps-checkpoint", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _writer(self) -> None:
        name_thread("ps-checkpoint")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                (version, blob, wal_lsn), self._pending = self._pending, None
                self._busy = True
            try:
                self._write(version, blob, wal_lsn)
            except OSError as exc:  # keep serving; the next checkpoint may succeed
                log.error("PS checkpoint of version %d failed: %s", version, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the background writer to finish what it has; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout=timeout)

    # ------------------------------------------------------------------ restoring

    def restore(self, shard: ShardState, *, keep_sync: SyncSettings | None = None) -> int | None:
        """Load the newest readable checkpoint into ``shard`` and replay the write-ahead log after it;
        then start logging to a fresh segment. Returns the version, or None if there was nothing to restore.

        ``keep_sync`` (the launcher's settings) replaces the restored sync settings once replayed.
        """
        for tmp in self.dir.glob(".version-*.tmp-*") if self.dir.is_dir() else ():
            tmp.unlink(missing_ok=True)  # left by a PS killed mid-write
        restored, wal_lsn = load_newest(shard, self.dir, keep_sync=None if self.wal is not None else keep_sync)
        if self.wal is None:
            return restored
        if wal_lsn >= 0:
            found = replay(shard, self.dir, after=wal_lsn)
        else:  # written without a log (or before LSNs): no record can be placed after it
            old = segments(self.dir)
            found = Replayed(dropped=old, highest=max((n for n, _ in old), default=-1))
            if old:
                log.warning("PS %d: the checkpoint names no write-ahead log position: not replaying the log",
                            shard.shard_index)
        if found.count:
            restored = shard.version
            log.info("PS %d replayed %d write-ahead log record(s): now at version %d",
                     shard.shard_index, found.count, shard.version)
        if restored is not None:
            self._wal_kept = [max(wal_lsn, 0)]
        self.wal.open_segment(found.highest + 1, lsn=found.last_lsn, known=found.known)
        self.wal.discard(found.dropped)
        shard.wal = self.wal
        if keep_sync is not None and restored is not None and keep_sync != shard.sync:
            shard.configure(sync=keep_sync)
        return restored
