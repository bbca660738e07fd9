"""In-memory ("flash") checkpoints driven against the real master over gRPC on loopback: each
snapshot in shared memory is the model at its step, the background writer's file is that same
state, and the ledger the master resolves for it (no per-snapshot RPC) is the data position of
exactly that step; a snapshot whose state lands after its task failed at a later step is refused."""

from __future__ import annotations

import threading

import pytest
import torch

from flextrain.data import make_shards
from flextrain.data.digits import write_digits
from flextrain.elastic.flash import ENV_ROOT, FlashStore, flash_dir, stem
from flextrain.elastic.statecodec import Encoded, decode, encode, encode_indexed
from flextrain.job import JobSpec
from flextrain.master.checkpoints import CheckpointStore
from flextrain.master.coordinator import JobMaster
from flextrain.master.main import build_ledger
from flextrain.master.servicer import MasterServicer, start_server
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.client import MasterClient
from flextrain.worker.collective import Collective
from flextrain.worker.flash import FlashCheckpointer
from flextrain.worker.module import load_model_def
from flextrain.worker.trainer import AllReduceTrainer, WorkerState
from ft_helpers import MODEL_ZOO

DIGITS = f"{MODEL_ZOO / 'digits_torch.py'}:Model"
EVERY = 3
PERSIST = 2  # every 2nd complete snapshot is written to the job directory


@pytest.fixture
def make_job(tmp_path, monkeypatch):
    """``make_job(**spec)``: a digits job's master served on loopback, and a client of worker-0."""
    monkeypatch.setenv(ENV_ROOT, str(tmp_path / "shm"))
    write_digits(tmp_path / "digits")
    started = []

    def make(**kw):
        spec = JobSpec.of(name="j", model_def=DIGITS, training_data=str(tmp_path / "digits" / "train"),
                          job_dir=str(tmp_path / "job"), global_batch_size=64, workers=1,
                          memory_checkpoint_steps=EVERY, **kw).validate()
        master = JobMaster(spec, build_ledger(spec), checkpoints=CheckpointStore(tmp_path / "job" / "checkpoints"))
        servicer = MasterServicer(master, status_json=lambda: "{}", stop=lambda reason: (False, ""),
                                  scale=lambda n: (False, ""), heartbeat_interval=0.5)
        server, port = start_server(servicer, host="127.0.0.1", port=0, threads=4)
        client = MasterClient(f"127.0.0.1:{port}", "worker-0")
        started.append((server, client))
        return spec, master, client

    yield make
    for server, client in started:
        client.close()
        server.stop(grace=None)


@pytest.fixture
def job(make_job):
    return make_job(steps_per_task=2, epochs=2, memory_checkpoint_persist_every=PERSIST,
                    memory_checkpoint_persist_seconds=0)  # by count alone


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_snapshots_are_the_model_and_persist_with_their_exact_ledger(job):
    spec, master, client = job
    model_def = load_model_def(DIGITS)
    model = model_def.build_model()
    state = WorkerState()
    trainer = AllReduceTrainer(spec=spec, model_def=model_def, model=model,
                               optimizer=model_def.build_optimizer(model, 0.1), client=client,
                               collective=Collective(), state=state)
    flash = trainer.flash
    assert flash is not None and flash.store.path == flash_dir("j", spec.job_dir)
    models: dict[int, dict] = {}
    blobs: dict[int, bytes] = {}  # what the training thread copied, by version
    take = flash.snapshot

    def snapshot(encode, position):
        version = position.version

        def copy():  # the trainer hands over encode_indexed's result: the writer checks it unparsed
            encoded = encode()
            assert isinstance(encoded, Encoded)
            blobs[version] = encoded.data
            return encoded

        take(copy, position)
        models[version] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        copied = decode(blobs[version])
        assert copied["version"] == version == state.version
        assert _equal(copied["model"], models[version])  # the snapshot is the model at that step

    flash.snapshot = snapshot
    completed = {}  # every ledger the master resolved for a snapshot in shared memory, by version
    put_ledger = master.flash.put_ledger
    master.flash.put_ledger = lambda pending, ledger: completed.setdefault(pending.version, ledger) and \
        put_ledger(pending, ledger)
    client.register(pid=0)
    joined = client.join(state.position(), "start")
    state.round_id = joined.round_id
    persisted = []
    report = client.report_checkpoint
    client.report_checkpoint = lambda path, position, **kw: persisted.append((path, position.version, kw)) or report(
        path, position, **kw)
    try:
        assert trainer.run_round() == pb.GetTaskResponse.NO_MORE
        flash.drain(discard=False)
        before_close = len(persisted)
    finally:
        trainer.loader.close()
        flash.close()

    G = spec.training.global_batch_size
    shards = make_shards(spec.data.training)
    steps = [min(i + G, sh.end) - i for sh in shards for i in range(sh.start, sh.end, G)] * 2
    assert sorted(models) == list(range(EVERY, len(steps) + 1, EVERY))
    # each snapshot is in shared memory or dropped (superseded while the writer was busy; training never
    # waits for the writer)
    assert flash.taken == len(models) and flash.completed + flash.dropped == flash.taken
    assert flash.completed >= len(completed) >= 1, (flash.taken, flash.dropped, master.snapshots_refused)
    for version, ledger in completed.items():  # each with the ledger of exactly its step
        assert ledger["records_done"] == sum(steps[:version])
    # every PERSIST-th snapshot written in the background; close() writes the newest when it was not
    assert before_close == flash.completed // PERSIST
    assert len(persisted) == before_close + (flash.completed % PERSIST != 0) == flash.persisted
    for _, _, kw in persisted:
        assert kw["memory"] and not kw["final"]
    assert persisted[-1][1] == max(models) - max(models) % EVERY
    # the newest persisted copy the master resolved, with the ledger resolved for it (the last one's
    # state may land after the job's last outcome: refused, as the job is over, its final checkpoint newer)
    path, version, _ = [p for p in persisted if p[1] in completed][-1]
    latest = master.checkpoints.latest()
    assert latest["version"] == version and latest["checkpoint"] == path and latest["ledger"] == completed[version]
    assert latest["ledger"]["records_done"] == sum(steps[:version])
    on_disk = decode(open(latest["checkpoint"], "rb").read())
    assert _equal(on_disk["model"], models[version])
    # the shared memory keeps only the newest resolved snapshot, with its ledger
    snap, skipped = flash.store.latest()
    assert snap.version == version and not skipped and flash.store.versions() == [version]
    assert snap.state_path.read_bytes() == blobs[version]


def _held(store: FlashStore):
    """Hold ``store``'s writes until the returned ``release`` is set; ``writing`` is set at the first."""
    writing, release = threading.Event(), threading.Event()
    put = store.put_state

    def held(blob, position):
        writing.set()
        assert release.wait(30)
        return put(blob, position)

    store.put_state = held
    return writing, release


def test_a_snapshot_whose_state_lands_after_its_task_failed_later_is_refused(make_job):
    """The writer is held until the round went on and a later step of the snapshot's task failed: the
    master refuses the snapshot when it lands (no ledger, state removed, its persisted copy not
    recorded), and the next one, inside the requeued remainder, is recorded with its exact position."""
    spec, master, client = make_job(steps_per_task=4, epochs=1, memory_checkpoint_persist_every=1)
    flash = FlashCheckpointer(store=FlashStore(flash_dir("j", spec.job_dir)),
                              checkpoints=master.checkpoints.directory, client=client, every=1, persist_every=1)
    _, released = _held(flash.store)
    G = spec.training.global_batch_size
    client.register(pid=0)
    r = client.join(pb.Position(round_id=-1), "start").round_id
    task = client.get_task(round_id=r, task_index=0, position=pb.Position(round_id=r)).task
    try:
        flash.snapshot(lambda: encode({"model": {"w": torch.ones(2)}, "version": 1}),
                       pb.Position(round_id=r, task_index=0, steps_done=1, version=1))
        # the round went on without waiting: steps 2 and 3 committed, step 4 failed on a bad record
        client.report_task(task.task_id, ok=False, steps_done=3, error="bad record")
        released.set()
        flash.drain(discard=False)
        assert master.snapshots_refused == 1 and flash.completed == flash.persisted == 1
        assert flash.store.versions() == [] and flash.store.latest() == (None, [])
        assert master.checkpoints.latest() is None
        assert master.ledger.records_done == 3 * G  # what the failure applied; the snapshot held 1 step

        rest = client.get_task(round_id=r, task_index=1, position=pb.Position(round_id=r, task_index=1, version=3))
        assert rest.task.start == task.start + 3 * G  # the failed task's remainder
        flash.snapshot(lambda: encode({"model": {"w": torch.ones(2)}, "version": 4}),
                       pb.Position(round_id=r, task_index=1, steps_done=1, version=4))
        flash.drain(discard=False)
    finally:
        flash.close()
    assert flash.completed == flash.persisted == 2
    latest = master.checkpoints.latest()
    assert latest["version"] == 4 and latest["ledger"]["records_done"] == 4 * G
    assert min(t["start"] for t in latest["ledger"]["todo"]) == task.start + 4 * G


def test_master_persists_the_newest_snapshot_and_clears_it(tmp_path, monkeypatch):
    """Every worker lost (or a resume): a resolved snapshot newer than the newest checkpoint is written
    to the job directory with its ledger; a newer pending one the master cannot place is refused."""
    monkeypatch.setenv(ENV_ROOT, str(tmp_path / "shm"))
    write_digits(tmp_path / "digits")
    spec = JobSpec.of(name="j", model_def=DIGITS, training_data=str(tmp_path / "digits" / "train"),
                      job_dir=str(tmp_path / "job"), global_batch_size=64, epochs=1, workers=1,
                      memory_checkpoint_steps=EVERY).validate()
    store = CheckpointStore(tmp_path / "job" / "checkpoints")
    master = JobMaster(spec, build_ledger(spec), checkpoints=store)
    ledger = master.ledger.snapshot()
    store.directory.mkdir(parents=True)
    (store.directory / "ckpt-000000004.ckpt").write_bytes(encode({"version": 4}))
    store.record(checkpoint="ckpt-000000004.ckpt", version=4, ledger=ledger, final=False)
    flash = master.flash
    assert flash is not None
    blob = encode({"model": {"w": torch.arange(3.0)}, "version": 9})
    flash.put_state(blob, pb.Position(round_id=0, task_index=1, steps_done=1, version=9))
    flash.put_ledger(flash.pending()[0], {**ledger, "records_done": 9 * 64})
    flash.put_state(encode({"version": 12}), pb.Position(round_id=0, task_index=1, steps_done=4, version=12))
    assert master.flush_flash() == 9  # (no round here: 12 cannot be placed)
    latest = store.latest()
    assert latest["version"] == 9 and latest["ledger"]["records_done"] == 9 * 64
    assert open(latest["checkpoint"], "rb").read() == blob
    assert flash.versions() == [] and master.snapshots_refused == 1
    assert master.flush_flash() is None  # nothing newer left


def test_flash_checkpoints_are_off_unless_asked_for(tmp_path):
    """Off by default until their step-time cost is below 1%: no shared memory, no flush."""
    write_digits(tmp_path / "digits")
    spec = JobSpec.of(name="j", model_def=DIGITS, training_data=str(tmp_path / "digits" / "train"),
                      job_dir=str(tmp_path / "job"), global_batch_size=64, epochs=1, workers=1).validate()
    assert spec.training.memory_checkpoint_steps == 0
    master = JobMaster(spec, build_ledger(spec), checkpoints=CheckpointStore(tmp_path / "job" / "checkpoints"))
    assert master.flash is None


def test_a_snapshot_superseded_while_the_writer_is_busy_is_dropped(make_job):
    """Only the newest waiting snapshot is written: one taken while the writer held an older one and
    superseded before it got to it costs only its copy."""
    spec, master, client = make_job(steps_per_task=4, epochs=1, memory_checkpoint_persist_every=1)
    flash = FlashCheckpointer(store=FlashStore(flash_dir("j", spec.job_dir)),
                              checkpoints=master.checkpoints.directory, client=client, every=1, persist_every=1)
    writing, released = _held(flash.store)
    client.register(pid=0)
    r = client.join(pb.Position(round_id=-1), "start").round_id
    client.get_task(round_id=r, task_index=0, position=pb.Position(round_id=r))
    older, newer = (encode({"model": {"w": torch.full((2,), v)}, "version": v}) for v in (1, 2))
    try:
        flash.snapshot(lambda: encode({"model": {}, "version": 0}), pb.Position(round_id=r))
        assert writing.wait(30)  # the writer holds the first snapshot
        flash.snapshot(lambda: older, pb.Position(round_id=r, task_index=0, steps_done=1, version=1))
        flash.snapshot(lambda: newer, pb.Position(round_id=r, task_index=0, steps_done=2, version=2))
        released.set()
        flash.drain(discard=False)
    finally:
        flash.close()
    assert flash.dropped == 1 and flash.completed == 2
    snap, _ = flash.store.latest()
    assert snap.version == 2 and snap.state_path.read_bytes() == newer
    assert master.snapshot_ledgers[stem(snap.position)]["records_done"] == 2 * spec.training.global_batch_size


def test_a_snapshot_goes_to_disk_when_due_by_count_and_by_time(make_job):
    """``persist_every`` = 2 and ``persist_seconds`` = 10 on an injected clock: a complete snapshot is
    written when it is at least the 2nd since the last write and 10 s have passed since it; a blocking
    checkpoint counts as a write; close() writes the newest not on disk."""
    spec, master, client = make_job(steps_per_task=4, epochs=1)
    now = [0.0]
    flash = FlashCheckpointer(store=FlashStore(flash_dir("j", spec.job_dir)), checkpoints=master.checkpoints.directory,
                              client=client, every=1, persist_every=2, persist_seconds=10.0, clock=lambda: now[0])
    reported, report = [], client.report_checkpoint
    client.report_checkpoint = lambda path, position, **kw: reported.append(position.version) or report(
        path, position, **kw)
    client.register(pid=0)
    r = client.join(pb.Position(round_id=-1), "start").round_id

    def take(version: int, at: float) -> int:
        now[0] = at
        flash.snapshot(lambda: encode({"model": {"w": torch.full((2,), float(version))}, "version": version}),
                       pb.Position(round_id=r, task_index=0, steps_done=version, version=version))
        flash.drain(discard=False)
        return flash.persisted

    try:
        # 2nd at t=0 (too soon); 3rd at t=10 (written); t=25: the 1st since (count), the 2nd (written)
        assert [take(1, 0), take(2, 0), take(3, 10), take(4, 25), take(5, 25)] == [0, 0, 1, 1, 2]
        now[0] = 30
        flash.drain(discard=True)  # a blocking checkpoint at t=30: the clock and the count restart
        assert [take(6, 36), take(7, 39.9), take(8, 40)] == [2, 2, 3]
        take(9, 100)  # the 1st since: not due by count
    finally:
        flash.close()  # writes 9, the newest not on disk
    assert flash.completed == 9 and flash.persisted == 4
    assert reported == [3, 5, 8, 9] and master.checkpoints.latest()["version"] == 9


@pytest.mark.parametrize("encoded", [True, False], ids=["encode_indexed", "bytes"])
def test_a_snapshot_with_non_finite_weights_is_never_kept(make_job, encoded):
    """The writer checks the model's weights before it keeps a snapshot, from the header as the
    training thread built it (``encode_indexed``: nothing parsed) or from plain bytes: a NaN in any
    of them drops it (a job must not resume with it); the optimizer's state is not the model's."""
    spec, master, client = make_job(steps_per_task=4, epochs=1, memory_checkpoint_persist_every=1000)
    flash = FlashCheckpointer(store=FlashStore(flash_dir("j", spec.job_dir)), checkpoints=master.checkpoints.directory,
                              client=client, every=1, persist_every=1000)
    client.register(pid=0)
    r = client.join(pb.Position(round_id=-1), "start").round_id
    codec = encode_indexed if encoded else encode

    def take(version: int, model: dict) -> None:
        tree = {"model": model, "optimizer": {"m": torch.tensor([float("nan")])}, "version": version}
        flash.snapshot(lambda: codec(tree), pb.Position(round_id=r, task_index=0, steps_done=version, version=version))
        flash.drain(discard=False)

    try:
        take(1, {"a": torch.ones(3), "b": torch.ones(2)})
        take(2, {"a": torch.ones(3), "b": torch.tensor([1.0, float("inf")])})
    finally:
        flash.close()
    assert (flash.taken, flash.completed, flash.dropped) == (2, 1, 1)
    assert flash.store.versions() == [1]


def test_put_ledger_prunes_what_the_listing_that_found_it_held(tmp_path):
    """The master's prune after a ledger reads the listing that found the snapshot (no second listdir):
    older snapshots and a ledger whose state went are removed; one put after that listing waits for
    the next ledger; with every state resolved, pending() is empty."""
    store = FlashStore(tmp_path / "flash")

    def pos(version: int) -> pb.Position:
        return pb.Position(round_id=1, task_index=0, steps_done=version, version=version)

    for version in (1, 2, 3):
        store.put_state(encode({"version": version}), pos(version))
    (tmp_path / "flash" / f"ledger-{stem(pos(0))}.json").write_text("{}")  # its state went
    found = store.pending()
    assert [p.version for p in found] == [3, 2, 1]
    store.put_state(encode({"version": 0}), pos(0))  # after the listing (a stale writer): not in it
    store.put_ledger(found[0], {"records_done": 3})
    names = sorted(p.name for p in (tmp_path / "flash").iterdir())
    assert names == [f"ledger-{stem(pos(3))}.json", f"state-{stem(pos(0))}.ckpt", f"state-{stem(pos(3))}.ckpt"]
    assert [p.version for p in store.pending()] == [0]
    store.put_state(encode({"version": 4}), pos(4))
    store.put_ledger(store.pending()[0], {"records_done": 4})
    assert store.versions() == [4] and store.pending() == []
    snap, skipped = store.latest()
    assert snap.version == 4 and snap.ledger == {"records_done": 4} and not skipped
