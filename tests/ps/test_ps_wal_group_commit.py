"""The PS write-ahead log's writer thread: group commit, pulls that never wait for it, durability of
every acknowledged push across a SIGKILL (fsync on and off), gradients logged in their own dtype,
and --ps-wal-fsync from `flextrain train` to the PS process.

The blocking log file below is a real file whose ``writev`` first waits on an Event: the writer
thread is held inside a write exactly as a slow disk would hold it.
"""

from __future__ import annotations

import signal
import socket
import threading

import pytest
import torch

from flextrain.master.launcher import LaunchBackend
from flextrain.ps.main import start_ps
from flextrain.ps.server import PSServicer, start_server
from flextrain.ps.state import ShardState, SyncSettings
from flextrain.ps.optimizers import make_optimizer
from flextrain.ps.wal import PUSH, WriteAheadLog
from flextrain.ps.walfiles import SegmentFile, read_records
from flextrain.worker.ps_client import PSClient

WAIT = 20  # seconds: a bound on waits that should end at once, never a stand-in for an event


class GatedFile(SegmentFile):
    """A real segment file; each write waits for ``gate`` (set: pass) and counts writes and flushes."""

    def __init__(self, path, gate: threading.Event, held: threading.Event, counts: dict) -> None:
        super().__init__(path)
        self.gate, self.held, self.counts = gate, held, counts

    def writev(self, views):
        if not self.gate.is_set():
            self.held.set()  # the writer thread is inside a write
            assert self.gate.wait(WAIT), "the test never released the log"
        self.counts["writes"] += 1
        return super().writev(views)

    def sync(self) -> None:
        self.counts["syncs"] += 1
        super().sync()


@pytest.fixture
def gated_ps(tmp_path):
    """A durable in-process PS (async SGD, lr 1) whose log writes can be held: (shard, wal, address, gate, held, counts)."""
    made = []

    def make(fsync: bool = False, sync: SyncSettings = SyncSettings("async")):
        gate, held, counts = threading.Event(), threading.Event(), {"writes": 0, "syncs": 0}
        gate.set()
        wal = WriteAheadLog(tmp_path / "wal", fsync=fsync, opener=lambda p: GatedFile(p, gate, held, counts))
        wal.open_segment(0)
        shard = ShardState(0, 1, optimizer=make_optimizer("sgd", {"lr": 1.0}), sync=sync)
        shard.wal = wal
        server, port = start_server(PSServicer(shard), host="127.0.0.1", port=0)
        made.append((server, wal, gate))
        return shard, wal, f"127.0.0.1:{port}", gate, held, counts

    yield make
    for server, wal, gate in made:
        gate.set()
        server.stop(0.2).wait()
        wal.close()


def _setup(address: str) -> PSClient:
    c = PSClient([address], give_up=WAIT, deadline=WAIT, client_id="setup")
    c.init_dense({"w": torch.zeros(4)})
    c.declare_table("e", 2, initializer="zeros")
    c.pull_dense(None)
    return c


@pytest.mark.parametrize("fsync", [False, True], ids=["write", "fsync"])
def test_concurrent_pushes_share_one_log_write_and_pulls_do_not_wait_for_it(gated_ps, fsync):
    shard, wal, address, gate, held, counts = gated_ps(fsync)
    setup = _setup(address)
    batches, records = wal.batches, wal.records
    clients = [PSClient([address], give_up=WAIT, deadline=WAIT, client_id=f"c{k}") for k in range(8)]
    for c in clients:
        c.pull_dense(None)
    answers: dict[int, object] = {}

    def push(k: int) -> None:
        answers[k] = clients[k].push({"w": torch.ones(4)}, {"e": ([k], torch.ones(1, 2))}, step=(k, 0, 1))

    gate.clear()
    threads = [threading.Thread(target=push, args=(0,))]
    threads[0].start()
    assert held.wait(WAIT)  # the first push's record is being written, and the write does not finish
    threads += [threading.Thread(target=push, args=(k,)) for k in range(1, 8)]
    for t in threads[1:]:
        t.start()
    assert wal.wait_queued(7, WAIT)  # the seven others are applied and queued behind it, none answered
    # (a record is queued under the shard lock just before its update is applied: info() takes that lock)
    assert not answers and shard.info()["version"] == 8

    # Pulls read the in-memory state while the writer is stuck inside write(2).
    version, params = setup.pull_dense(None)
    assert version == 8 and torch.equal(params["w"], torch.full((4,), -8.0))
    assert torch.equal(setup.pull_embedding("e", list(range(8))), -torch.ones(8, 2))
    assert not answers

    gate.set()
    for t in threads:
        t.join(WAIT)
    assert sorted(answers) == list(range(8)) and all(r.accepted and r.applied for r in answers.values())
    assert wal.records - records == 8
    assert wal.batches - batches == 2  # the first push alone, then the seven queued meanwhile in one write
    if fsync:
        assert counts["syncs"] == wal.batches  # one flush per group commit, not per push
    else:
        assert counts["syncs"] == 0
    for c in [setup, *clients]:
        c.close()


def test_a_retry_answered_from_memory_still_waits_for_the_log(gated_ps):
    """A retried push is answered from the remembered result; not before that result is on disk."""
    shard, wal, address, gate, held, _ = gated_ps()
    _setup(address).close()
    grad = bytearray(shard.dense.total_bytes)
    torch.frombuffer(grad, dtype=torch.float32)[:] = 1.0
    gate.clear()
    first = threading.Thread(target=lambda: shard.push(client_id="x", seq=1, base_version=0,
                                                       layout_id=shard.dense.layout_id, dense=grad))
    first.start()
    assert held.wait(WAIT)
    retry: list = []
    again = threading.Thread(target=lambda: retry.append(shard.push(client_id="x", seq=1, base_version=0)))
    again.start()
    again.join(0.2)  # it must still be waiting: the log has not written the push it repeats
    assert again.is_alive() and not retry
    gate.set()
    first.join(WAIT)
    again.join(WAIT)
    assert retry[0].accepted and shard.version == 1  # the same answer, applied once


def test_sync_accumulation_never_sums_into_a_gradient_the_log_has_not_written(gated_ps, tmp_path):
    shard, wal, address, gate, held, _ = gated_ps(sync=SyncSettings("sync", grads_to_wait=2))
    _setup(address).close()
    layout = shard.dense.layout_id
    grads = []
    for value in (1.0, 2.0):
        g = bytearray(shard.dense.total_bytes)
        torch.frombuffer(g, dtype=torch.float32)[:] = value
        grads.append(g)
    gate.clear()
    answers: list = []
    first = threading.Thread(target=lambda: answers.append(
        shard.push(client_id="a", seq=1, base_version=0, layout_id=layout, dense=grads[0])))
    first.start()
    assert held.wait(WAIT)  # push 1 collected, its record held inside write(2)
    second = threading.Thread(target=lambda: answers.append(
        shard.push(client_id="b", seq=1, base_version=0, layout_id=layout, dense=grads[1])))
    second.start()
    assert wal.wait_queued(1, WAIT)
    assert shard.info()["version"] == 1  # the update (mean of both) is applied meanwhile
    gate.set()
    first.join(WAIT)
    second.join(WAIT)
    assert len(answers) == 2
    wal.close()
    logged = [bytes(blobs) for kind, head, blobs in read_records(tmp_path / "wal" / "wal-0.log")[0] if kind == PUSH]
    assert [torch.frombuffer(bytearray(b), dtype=torch.float32)[0].item() for b in logged] == [1.0, 2.0]
    torch.testing.assert_close(shard.dense.params.views["w"], torch.full((4,), -1.5))


def test_gradients_are_logged_in_the_shards_own_dtypes(tmp_path):
    wal = WriteAheadLog(tmp_path)
    wal.open_segment(0)
    shard = ShardState(0, 1, optimizer=make_optimizer("sgd", {"lr": 0.5}), sync=SyncSettings("async"))
    shard.wal = wal
    from flextrain.ps.dense import Spec
    from flextrain.ps.embedding import TableSpec
    from flextrain.protocol.codec import RowBlock

    shard.init_dense([Spec("w", "bfloat16", (8,))], bytearray(16))
    shard.declare_tables([TableSpec("e", 4, "float16", "zeros")])
    grad = bytearray(shard.dense.total_bytes)
    rows = torch.ones((3, 4), dtype=torch.float16)
    result = shard.push(client_id="a", seq=1, base_version=0, layout_id=shard.dense.layout_id, dense=grad,
                        sparse=[RowBlock.of("e", [1, 2, 3], rows)])
    assert result.applied
    wal.close()
    pushes = [(head, blobs) for kind, head, blobs in read_records(tmp_path / "wal-0.log")[0] if kind == PUSH]
    head, blobs = pushes[0]
    assert head["dense"] == 16 and head["sparse"] == [["e", 3, 4, "float16"]]  # bfloat16 and float16, not widened
    assert head["blobs"] == [16, 3 * 8, 3 * 4 * 2] and len(blobs) == 16 + 24 + 24


class RecordingBackend(LaunchBackend):
    """Records launches; a launched PS "listens" at once by writing its address file."""

    def __init__(self) -> None:
        super().__init__()
        self.launched = []

    def launch(self, spec):
        self.launched.append(spec)
        args = list(spec.args)
        with open(args[args.index("--address-file") + 1], "w") as f:
            f.write(f"127.0.0.1:{5000 + spec.index}\n")

    def terminate(self, instance_id, *, force=False):
        pass

    def running(self):
        return set()

    def close(self, *, grace=5.0):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fsync", [False, True], ids=["write", "fsync"])
def test_every_acknowledged_push_survives_a_sigkill_and_is_applied_exactly_once(tmp_path, spawn_ps, fsync):
    port = _free_port()
    args = ["--shard-index", "0", "--num-ps", "1", "--port", str(port), "--optimizer", "sgd", "--hyper", "lr=1",
            "--mode", "async", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "7",
            *(["--wal-fsync"] if fsync else [])]
    proc, address = spawn_ps(*args)
    setup = PSClient([address], give_up=WAIT, deadline=WAIT, client_id="setup")
    setup.init_dense({"w": torch.zeros(4)})
    setup.declare_table("e", 2, initializer="zeros")
    workers, per = 4, 6
    acked = [[] for _ in range(workers)]

    def work(k: int) -> None:  # each worker: its own task k, minibatches [i, i+1), a row of its own
        c = PSClient([address], give_up=WAIT, deadline=WAIT, client_id=f"w{k}")
        c.pull_dense(None)
        for i in range(per):
            r = c.push({"w": torch.ones(4)}, {"e": ([k], torch.ones(1, 2))}, step=(k, i, i + 1))
            assert r.accepted and r.applied
            acked[k].append(i)
        c.close()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [len(a) for a in acked] == [per] * workers  # every push acknowledged, then:
    proc.send_signal(signal.SIGKILL)  # no final checkpoint, nothing flushed on the way out
    proc.wait(10)

    _, address = spawn_ps(*args, name="again")
    c = PSClient([address], give_up=WAIT, deadline=WAIT, client_id="after")
    info = c.describe()[0]
    assert info.version == workers * per
    version, params = c.pull_dense(None)
    assert torch.equal(params["w"], torch.full((4,), -float(workers * per)))  # each push once, none lost
    assert torch.equal(c.pull_embedding("e", list(range(workers))), torch.full((workers, 2), -float(per)))
    assert [c.task_progress(k)[0] for k in range(workers)] == [per] * workers
    again = c.push({"w": torch.ones(4)}, step=(0, per - 1, per))  # a worker retrying its last minibatch
    assert again.accepted and not again.applied and again.duplicates == (True,)
    assert c.describe()[0].version == workers * per
    c.close()
    setup.close()


def test_ps_wal_fsync_goes_from_the_train_flag_to_the_ps_process(tmp_path):
    from flextrain.cli import build_spec, make_parser
    from flextrain.job import JobSpecError
    from flextrain.k8s.resource import jobspec_from_resource, resource_from_jobspec
    from flextrain.master.ps_fleet import PSFleet
    from flextrain.ps.main import make_parser as ps_parser

    def spec(*extra):
        return build_spec(make_parser().parse_args(
            ["train", "--model-def", "m.py:Model", "--training-data", "d", "--job-dir", str(tmp_path),
             "--distribution-strategy", "ParameterServer", "--ps", "1", *extra]))

    assert spec().ps.ps_wal_fsync is False
    on = spec("--ps-wal-fsync")
    assert on.ps.ps_wal_fsync is True
    resource = resource_from_jobspec(on, image="flextrain:test", namespace="default")
    assert resource["spec"]["replicaSpecs"]["ps"]["psWalFsync"] is True
    assert jobspec_from_resource(resource).ps.ps_wal_fsync is True
    with pytest.raises(JobSpecError, match="--no-ps-wal"):
        spec("--ps-wal-fsync", "--no-ps-wal").validate()

    for job, expect in ((on, True), (spec(), False)):
        backend = RecordingBackend()
        fleet = PSFleet(backend, job.validate(), relaunch_budget=0)
        fleet.start()
        argv = list(backend.launched[0].args)
        parsed = ps_parser().parse_args(argv[argv.index("ps") + 1:])
        assert parsed.wal_fsync is expect and parsed.wal is True
        fleet.close()

    handle = start_ps(host="127.0.0.1", checkpoint_dir=tmp_path / "ck", wal_fsync=True)
    try:
        assert handle.shard.wal is not None and handle.shard.wal.fsync is True
    finally:
        handle.stop(grace=0.2, checkpoint=False)
