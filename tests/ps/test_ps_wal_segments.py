"""The PS write-ahead log's recycled, preallocated segments: rotation across checkpoints, bounded disk,
replay that stops exactly at the end of the valid log in a recycled file, and pulls that never wait for
the log (its writer held inside a write, an fdatasync or a segment change)."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import torch

from flextrain.ps.checkpoint import Checkpointer
from flextrain.ps.dense import Spec
from flextrain.ps.embedding import TableSpec
from flextrain.ps.optimizers import make_optimizer
from flextrain.ps.settings import SyncSettings
from flextrain.ps.state import ShardState
from flextrain.ps.wal import WriteAheadLog
from flextrain.ps.walfiles import FRAME, RELEASE_BYTES, SegmentFile, _write_once, scan_segment, segments

SEGMENT = 4096  # the smallest segment: a few pushes each, so a short test crosses many segments
N = 200         # float32 parameters: one push record is ~0.9 KB, 4 to a segment
WAIT = 20       # seconds: a bound on waits that should end at once, never a stand-in for an event


def _shard() -> ShardState:
    return ShardState(0, 1, optimizer=make_optimizer("sgd", {"lr": 1.0}), sync=SyncSettings("async"))


def _durable(directory, **kw) -> tuple[ShardState, Checkpointer]:
    ck = Checkpointer(directory, 0, keep=2, wal_segment_bytes=SEGMENT, **kw)
    shard = _shard()
    ck.restore(shard)
    return shard, ck


def _push(shard: ShardState, seq: int, value: float) -> None:
    grad = bytearray(torch.full((N,), value).numpy().tobytes())
    # seq of 3 digits and base 0: every push record has the same length, so a recycled file's old
    # records sit exactly where new ones end (the case the segment number in each record is for)
    result = shard.push(client_id="c", seq=seq, base_version=0, layout_id=shard.dense.layout_id, dense=grad)
    assert result.applied


def _wal_files(directory) -> dict[int, int]:
    return {n: os.stat(p).st_ino for n, p in segments(directory / "ps-0")}


def test_segments_rotate_and_recycle_across_checkpoints_with_bounded_disk_and_replay_exactly(tmp_path):
    shard, ck = _durable(tmp_path)
    shard.init_dense([Spec("w", "float32", (N,))], bytearray(4 * N))
    inodes, most, expect, seq = set(), 0, torch.zeros(N), 100
    for round_ in range(8):
        for _ in range(9):  # ~2 segments of log per checkpoint
            seq += 1
            _push(shard, seq, seq / 1000)
            expect -= seq / 1000
        ck.save(shard)
        files = _wal_files(tmp_path)
        inodes |= set(files.values())
        most = max(most, len(files))
    written = shard.wal.number
    assert written >= 12                  # the log crossed many segments...
    assert ck.wal.pool.recycled >= 6      # ...most of them recycled files...
    assert len(inodes) < written          # ...so fewer files were ever made than segments written
    # needed since the older kept checkpoint (~5) + the one being written + at most 4 spares
    assert most <= 10, f"{most} segment files on disk"
    version = shard.version

    def stale_after_the_log() -> bool:
        """The segment being written is a recycled file, and right after its valid records lies a whole
        record of its previous life (the one reading must not take for new)."""
        number = shard.wal.number
        data = memoryview((tmp_path / "ps-0" / f"wal-{number}.log").read_bytes())
        good = scan_segment(data, number)[1]
        old = FRAME.unpack_from(data, good)[4]
        return old < number and bool(scan_segment(data[good:], old)[0])

    for _ in range(12):  # after the last checkpoint: these come back from the log alone
        seq += 1
        _push(shard, seq, seq / 1000)
        expect -= seq / 1000
        if stale_after_the_log():
            break
    assert stale_after_the_log()
    shard.wal.close()  # the process dies here: everything it answered is written

    again, ck2 = _durable(tmp_path)
    try:
        assert again.version == version + (seq - 100) - 8 * 9
        torch.testing.assert_close(again.dense.params.views["w"], expect)
        assert again.wal.appended == shard.wal.appended  # LSNs go on where the log ended
        assert again.wal.number > max(_wal_files(tmp_path)) - 3  # a fresh number above the old segments
    finally:
        again.wal.close()


def test_a_log_break_ends_replay_and_later_records_never_come_back(tmp_path):
    shard, ck = _durable(tmp_path)
    shard.init_dense([Spec("w", "float32", (N,))], bytearray(4 * N))
    for seq in range(101, 113):  # 12 pushes: 3+ segments
        _push(shard, seq, 1.0)
    shard.wal.close()
    first = min(n for n, _ in segments(tmp_path / "ps-0"))
    path = tmp_path / "ps-0" / f"wal-{first + 1}.log"
    data = bytearray(path.read_bytes())
    records, good = scan_segment(memoryview(data), first + 1)
    assert len(records) >= 2
    data[FRAME.size + 2] ^= 0xFF  # damage the first record of the second segment: the log ends before it
    path.write_bytes(bytes(data))
    kept = len(scan_segment(memoryview((tmp_path / "ps-0" / f"wal-{first}.log").read_bytes()), first)[0])

    again, _ = _durable(tmp_path)
    assert again.version == kept - 1  # init_dense + the pushes of the first segment, nothing after the break
    _push(again, 500, 1.0)
    again.wal.close()
    third, _ = _durable(tmp_path)  # the segments past the break were recycled: the new record follows on
    try:
        assert third.version == kept
    finally:
        third.wal.close()


class GatedFile(SegmentFile):
    """A real segment file whose writes (or, ``in_sync``, flushes) wait while ``gate`` is clear (``held``
    is set meanwhile: the writer thread is inside)."""

    def __init__(self, path, gate: threading.Event, held: threading.Event, *, in_sync: bool = False) -> None:
        super().__init__(path)
        self.gate, self.held, self.in_sync = gate, held, in_sync

    def _hold(self) -> None:
        if not self.gate.is_set():
            self.held.set()
            assert self.gate.wait(WAIT), "the test never released the log"

    def writev(self, views):
        if not self.in_sync:
            self._hold()
        return super().writev(views)

    def sync(self) -> None:
        if self.in_sync:
            self._hold()
        super().sync()


def test_pulls_and_a_checkpoint_snapshot_complete_while_the_log_is_held_in_fdatasync(tmp_path):
    gate, held = threading.Event(), threading.Event()
    gate.set()
    ck = Checkpointer(tmp_path, 0, wal_fsync=True)
    ck.wal = WriteAheadLog(ck.dir, fsync=True, segment_bytes=SEGMENT, opener=lambda p: GatedFile(p, gate, held, in_sync=True))
    shard = _shard()
    ck.restore(shard)
    shard.init_dense([Spec("w", "float32", (N,))], bytearray(4 * N))
    shard.declare_tables([TableSpec("e", 2, "float32", "zeros")])
    gate.clear()
    pusher = threading.Thread(target=_push, args=(shard, 101, 1.0))
    pusher.start()
    try:
        assert held.wait(WAIT)  # the push's record is written, the writer is inside fdatasync, no answer yet
        unchanged, version, _, chunks = shard.pull_dense(-1, 0, 0.0, 1 << 20)
        assert not unchanged and version == 1 and chunks
        rows = [block for block, _ in shard.pull_row_blocks("e", [1, 2, 3], 1 << 20)]
        assert sum(len(b) for b in rows) == 3
        snapshot = ck.snapshot(shard)  # takes every shard lock, touches no file
        assert snapshot[0] == 1 and snapshot[2] == shard.wal.appended
        assert pusher.is_alive()
    finally:
        gate.set()
    pusher.join(WAIT)
    assert not pusher.is_alive()
    shard.wal.close()



def test_a_segment_the_writer_just_left_is_never_recycled_while_its_batch_is_being_written(tmp_path):
    gates = {0: (threading.Event(), threading.Event()), 1: (threading.Event(), threading.Event())}
    wal = WriteAheadLog(tmp_path, segment_bytes=SEGMENT, spares=0,
                        opener=lambda p: GatedFile(p, *gates[int(p.stem[4:])]))
    wal.open_segment(0)
    blob = bytearray(1500)  # two records fit in a segment, the third starts the next one
    specs = [Spec("w", "float32", (375,))]
    first = wal.log_init_dense(specs, blob)  # held inside its write to segment 0
    assert gates[0][1].wait(WAIT)
    wal.log_init_dense(specs, blob)  # queued meanwhile: the next batch, segment 0...
    last = wal.log_init_dense(specs, blob)  # ...and segment 1
    gates[0][0].set()
    assert gates[1][1].wait(WAIT)  # the writer moved to segment 1 mid-batch, the batch is not done
    wal.recycle(keep_after=first)  # a checkpoint that includes record 1 only
    gates[1][0].set()
    wal.wait(last, WAIT)
    wal.close()
    assert len(scan_segment(memoryview((tmp_path / "wal-0.log").read_bytes()), 0)[0]) == 2  # record 2 kept


def test_a_segment_prepared_ahead_is_written_whole_with_zeros_over_a_previous_life(tmp_path):
    # Sizes off the 4 KiB block size and over one 4 MiB write, on the test's disk and on tmpfs.
    places = [tmp_path] + ([Path("/dev/shm")] if Path("/dev/shm").is_dir() else [])
    for place in places:
        for size in (4096, 4096 * 3 + 100, (4 << 20) + 8192 + 1):
            path = place / f"flextrain-spare-{os.getpid()}-{size}"
            try:
                path.write_bytes(b"\xff" * (size + 4096))  # a previous life: must not show through
                _write_once(path, size)
                data = path.read_bytes()
                assert data == bytes(size), (place, size)  # truncated to the size, every byte zero
                assert os.stat(path).st_blocks * 512 >= size  # allocated, not a hole
            finally:
                path.unlink(missing_ok=True)


def _resident_pages(path: Path) -> int:
    """How many of ``path``'s pages the page cache holds (mincore(2) over a private mapping)."""
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:  # never written
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        vec = ctypes.create_string_buffer(pages)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))  # the temporary export ends here
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
        return sum(b & 1 for b in vec.raw)


def test_written_log_pages_leave_the_page_cache_once_on_the_device(tmp_path):
    # Each batch gives back the page cache that the log's earlier, written-back bytes held: the log must
    # not grow memory by every byte logged (bench/README.md, ps.py). A small write is not worth a syscall.
    path = tmp_path / "wal-0.log"
    f = SegmentFile(path)
    try:
        f.writev([memoryview(b"\x01" * (RELEASE_BYTES // 2 + 100))])
        f.sync()
        f.release()  # under RELEASE_BYTES since the last release: nothing asked
        held = _resident_pages(path)
        if held == 0:  # a file system without a page cache for this file (tmpfs keeps its own): nothing to see
            return
        assert held == (RELEASE_BYTES // 2 + 100 + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        f.writev([memoryview(b"\x02" * RELEASE_BYTES)])
        f.sync()  # on the device: clean pages, which the advice drops
        f.release()
        assert _resident_pages(path) <= 1  # at most the partial last page stays (the next write goes there)
    finally:
        f.close()
    assert path.read_bytes() == b"\x01" * (RELEASE_BYTES // 2 + 100) + b"\x02" * RELEASE_BYTES  # nothing lost
