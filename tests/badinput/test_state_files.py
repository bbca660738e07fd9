"""Damaged job state: checkpoint blobs, ledger files and latest.json are checked before use.

A file that fails its checksum or its consistency check is named; a resume (or a
rollback) falls back to the previous consistent checkpoint with a warning, and with
none left the job refuses, naming the files. A write that fails (a full disk) leaves
no temp file and keeps the previous file.
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flextrain import durable
from flextrain.data import Shard
from flextrain.elastic import statecodec
from flextrain.elastic.statecodec import StateCodecError, decode, encode
from flextrain.master import ps_tasks
from flextrain.master.checkpoints import (CheckpointError, CheckpointStore, StateFileError, StateWriteError,
                                          read_json_checked, write_json_atomic)
from flextrain.master.ledger import LedgerStateError, TaskLedger
from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, run_flextrain, seen_counts, wait_for


# ---- checkpoint blobs -------------------------------------------------------------
def _state():
    return {"model": {"w": torch.arange(64, dtype=torch.float32)}, "version": 3}


def test_a_flipped_byte_in_a_blob_is_a_checksum_error():
    blob = bytearray(encode(_state()))
    blob[-20] ^= 0x40  # one bit of a weight (the exponent of a float32: silently huge without the check)
    with pytest.raises(StateCodecError, match="checksum mismatch"):
        decode(bytes(blob))
    with pytest.raises(StateCodecError, match="checksum mismatch"):
        statecodec.verify(bytes(blob))


def test_a_cut_off_blob_is_named_truncated():
    blob = encode(_state())
    with pytest.raises(StateCodecError, match="truncated"):
        decode(blob[:-1])
    with pytest.raises(StateCodecError, match="trailing"):
        decode(blob + b"\0")


def test_version_1_blobs_without_a_checksum_still_decode():
    blob = encode(_state())
    magic, version, header_len = struct.unpack_from("<4sIQ", blob, 0)
    assert version == statecodec.VERSION == 2
    old = struct.pack("<4sIQ", magic, 1, header_len) + blob[16:-4]  # what version 1 wrote
    back = decode(old)
    assert torch.equal(back["model"]["w"], _state()["model"]["w"]) and back["version"] == 3


# ---- JSON state files ---------------------------------------------------------------
def test_json_files_carry_a_checksum_and_a_changed_one_is_named(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"epoch": 1, "records_done": 5}, checksum=True)
    assert read_json_checked(path) == {"epoch": 1, "records_done": 5}
    path.write_text(path.read_text().replace('"records_done": 5', '"records_done": 6'))
    with pytest.raises(StateFileError, match="^" + re.escape(f"{path}: checksum mismatch")):
        read_json_checked(path)
    path.write_text('{"epoch": 1, "recor')
    with pytest.raises(StateFileError, match="^" + re.escape(f"{path}: not valid JSON") + ".*truncated or damaged"):
        read_json_checked(path)


class _NoSpace:
    """The ``os`` module as seen by flextrain.durable (every atomic state write), with a disk that fills up
    mid-write."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def write(fd, data):
        os.write(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_leaves_no_temp_file_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "latest.json"
    write_json_atomic(path, {"version": 1}, checksum=True)
    before = path.read_bytes()
    monkeypatch.setattr(durable, "os", _NoSpace())
    with pytest.raises(StateWriteError, match=re.escape(f"cannot write {path}: No space left on device")) as info:
        write_json_atomic(path, {"version": 2}, checksum=True)
    assert info.value.errno == errno.ENOSPC and "the previous file is kept" in str(info.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json"]  # no temp file


# ---- checkpoint store: fallback -------------------------------------------------------
def _ledger() -> TaskLedger:
    return TaskLedger(shards=[Shard("/data/a.rio", 0, 64)], epochs=3, global_batch_size=8, steps_per_task=2)


def _store(tmp_path) -> tuple[CheckpointStore, list[Path]]:
    """A store with checkpoints of steps 2 and 4 (blob + ledger file), as a job writes them."""
    store, ledger, paths = CheckpointStore(tmp_path / "checkpoints"), _ledger(), []
    store.directory.mkdir(parents=True)
    for version in (2, 4):
        task = ledger.next_training_task("round-1")
        ledger.complete(task.task_id)
        path = store.directory / f"ckpt-{version:09d}.ckpt"
        path.write_bytes(encode({"model": {"w": torch.full((4,), float(version))}, "version": version}))
        store.record(checkpoint=str(path), version=version, ledger=ledger.to_dict(), final=False)
        paths.append(path)
    return store, paths


def test_intact_store_resumes_from_the_newest(tmp_path):
    store, paths = _store(tmp_path)
    entry, damaged = store.resume_point(check=_ledger().check_state)
    assert damaged == [] and entry["checkpoint"] == str(paths[1]) and entry["version"] == 4
    assert entry["ledger"]["records_done"] == 32


@pytest.mark.parametrize("damage", ["blob", "ledger", "latest"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, damage):
    store, paths = _store(tmp_path)
    target = {"blob": paths[1], "ledger": store.directory / "ledger-000000004.json",
              "latest": store.latest_path}[damage]
    data = target.read_bytes()
    if damage == "blob":
        target.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    else:
        target.write_bytes(data[: len(data) // 2])  # truncated
    entry, damaged = store.resume_point(check=_ledger().check_state)
    assert len(damaged) == 1 and damaged[0].startswith(f"{target}: ")
    if damage == "latest":  # the newest pair itself is intact: its ledger file names its checkpoint
        assert entry["checkpoint"] == str(paths[1]) and entry["version"] == 4
    else:
        assert entry["checkpoint"] == str(paths[0]) and entry["version"] == 2
        assert entry["ledger"]["records_done"] == 16


def test_no_consistent_checkpoint_left_names_every_file(tmp_path):
    store, paths = _store(tmp_path)
    for path in paths:
        path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(CheckpointError) as info:
        store.resume_point(check=_ledger().check_state)
    message = str(info.value)
    assert message.startswith(f"no usable checkpoint in {store.directory}: ")
    assert all(f"{path}: state blob tensor data truncated" in message for path in paths)
    assert store.latest() is not None  # status messages still name the newest (its blob is not read)


@pytest.mark.parametrize("field, value, expected", [
    ("epoch", 7, "epoch is 7, beyond the job's 3 epoch(s)"),
    ("records_done", 999_999, "records_done is 999999, but the job has 192 records"),
    ("todo", [{"task_id": 9, "kind": "training", "source": "/data/other.rio", "start": 0, "end": 16, "epoch": 0,
               "global_batch_size": 8, "retries": 0, "owner": "", "model_version": 0}],
     "todo[0].source '/data/other.rio' is not a source of the job's training data"),
    ("todo", [{"task_id": 9, "kind": "training", "source": "/data/a.rio", "start": 48, "end": 80, "epoch": 0,
               "global_batch_size": 8, "retries": 0, "owner": "", "model_version": 0}],
     "todo[0] records [48, 80) are not within the records of /data/a.rio"),
])
def test_an_inconsistent_ledger_is_refused_naming_the_file_and_field(tmp_path, field, value, expected):
    store, paths = _store(tmp_path)
    for version in (2, 4):  # rewritten with a valid checksum: only the consistency check can tell
        path = store.directory / f"ledger-{version:09d}.json"
        data = read_json_checked(path)
        data[field] = value
        write_json_atomic(path, data, checksum=True)
    with pytest.raises(LedgerStateError, match=re.escape(expected)):
        _ledger().restore(read_json_checked(store.directory / "ledger-000000004.json"))
    with pytest.raises(CheckpointError) as info:
        store.resume_point(check=_ledger().check_state)
    assert f"{store.directory / 'ledger-000000004.json'}: inconsistent ledger: {expected}" in str(info.value)
    assert f"{store.directory / 'ledger-000000002.json'}: inconsistent ledger: {expected}" in str(info.value)


def test_ps_ledger_is_checked_on_resume(tmp_path):
    notes: list[str] = []
    job = SimpleNamespace(spec=SimpleNamespace(job_dir=str(tmp_path), ps_checkpoint_dir=str(tmp_path / "ps")),
                          ledger=_ledger(), note=notes.append, cond=__import__("threading").RLock())
    path = ps_tasks.save_ledger(job)
    assert ps_tasks.resume_ledger(job) is None and notes[-1].startswith(f"resumed from {path}: 0 of 192")
    task = job.ledger.next_training_task("w")
    job.ledger.complete(task.task_id)
    ps_tasks.save_ledger(job)  # the first one stays as the previous ledger
    previous = path.with_name(ps_tasks.PREVIOUS_LEDGER_FILE)
    assert read_json_checked(previous)["ledger"]["records_done"] == 0

    data = read_json_checked(path)
    data["ledger"]["epoch"] = 7
    write_json_atomic(path, data, checksum=True)  # a valid checksum: only the consistency check can tell
    assert ps_tasks.resume_ledger(job) is None  # falls back to the previous ledger, naming the damaged one
    assert notes[-2] == (f"damaged task ledger skipped: {path}: LedgerStateError: epoch is 7, beyond the job's "
                         f"3 epoch(s) (counted from 0: at most 2); using {previous}")
    assert job.ledger.records_done == 0

    previous.write_text(previous.read_text()[:30])  # truncated: neither is usable
    refused = ps_tasks.resume_ledger(job)
    assert refused.startswith(f"cannot resume: no usable task ledger: {path}: LedgerStateError: epoch is 7")
    assert f"; {previous}: not valid JSON" in refused


def test_a_full_disk_at_a_checkpoint_fails_the_job_keeping_the_last_good_one(tmp_path, monkeypatch):
    from flextrain.job import JobSpec
    from flextrain.master.coordinator import JobMaster, Phase
    from flextrain.proto import flextrain_pb2 as pb

    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                   global_batch_size=8, steps_per_task=2, epochs=3).validate()
    store = CheckpointStore(tmp_path / "checkpoints")
    master = JobMaster(spec, _ledger(), checkpoints=store)
    master.register("A")
    assert master.join("A", pb.Position(round_id=-1), wait=0).action == pb.JoinRendezvousResponse.TRAIN
    store.directory.mkdir()
    for version in (2, 4):
        path = store.directory / f"ckpt-{version:09d}.ckpt"
        path.write_bytes(encode({"model": {}, "version": version}))
        if version == 4:
            monkeypatch.setattr(durable, "os", _NoSpace())
        master.report_checkpoint(pb.ReportCheckpointRequest(worker_id="A", path=str(path),
                                                            position=pb.Position(round_id=0, version=version)))
    assert master.phase is Phase.FAILED
    assert master.message.startswith(f"cannot record the checkpoint of step 4: cannot write "
                                     f"{store.directory / 'ledger-000000004.json'}: No space left on device")
    assert master.message.endswith(f"the last good checkpoint is kept: {store.directory / 'ckpt-000000002.ckpt'} "
                                   "(step 2)")
    monkeypatch.undo()
    assert store.resume_point(check=_ledger().check_state)[0]["version"] == 2
    assert not [p for p in store.directory.iterdir() if ".tmp" in p.name]


def test_a_full_disk_at_a_worker_checkpoint_is_a_clear_failure(tmp_path, monkeypatch):
    from flextrain.worker import trainer
    from flextrain.worker.checkpoints import CheckpointWriteError

    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "ckpt-000000002.ckpt").write_bytes(encode(_state()))
    monkeypatch.setattr(durable, "os", _NoSpace())
    me = SimpleNamespace(spec=SimpleNamespace(checkpoint_dir=directory), state=SimpleNamespace(version=3),
                         backend=SimpleNamespace(state=lambda: {"model": {"w": torch.ones(2)}}), client=None,
                         adascale=None, flash=None)
    me.state_tree = lambda: trainer.AllReduceTrainer.state_tree(me)
    with pytest.raises(CheckpointWriteError) as info:
        trainer.AllReduceTrainer.checkpoint(me)
    assert str(info.value) == (f"cannot write checkpoint {directory / 'ckpt-000000003.ckpt'}: No space left on "
                               "device; the previous checkpoint is kept")
    assert sorted(p.name for p in directory.iterdir()) == ["ckpt-000000002.ckpt"]  # no temp file


# ---- end to end ----------------------------------------------------------------------------
G = 32


@pytest.mark.e2e
def test_resume_falls_back_past_a_damaged_checkpoint_and_applies_each_record_once(digits_data, tmp_path):
    records, epochs = 256, 120
    data = counting_data(digits_data, tmp_path / "data", records=records)
    job_dir = tmp_path / "job"
    env = {**os.environ, "FT_COUNT_G": str(G), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(flextrain_cmd(
        "train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size", str(G),
        "--max-micro-batch", "16", "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "1",
        "--epochs", str(epochs), "--checkpoint-steps", "4", "--no-preflight", "--no-progress"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # Two checkpoints (a newest and one to fall back to) come after ~1 of 120 epochs: the stop
        # lands long before the end (at 10% of 60 epochs, the rest once ran out while `stop` started).
        wait_for(lambda: len(list((job_dir / "checkpoints").glob("ckpt-*.ckpt"))) >= 2, timeout=120,
                 what="two checkpoints")
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    ckpt_dir = job_dir / "checkpoints"
    newest = ckpt_dir / json.loads((ckpt_dir / "latest.json").read_text())["checkpoint"]
    older = [p for p in sorted(ckpt_dir.glob("ckpt-*.ckpt")) if p != newest]
    assert older, sorted(ckpt_dir.iterdir())
    intact = {p: p.read_bytes() for p in (newest, older[-1])}
    for path, data_ in intact.items():  # every checkpoint damaged: the resume refuses, naming them
        path.write_bytes(data_[:-10] + bytes([data_[-10] ^ 0x80]) + data_[-9:])  # a bit of a tensor
    refused = subprocess.run(flextrain_cmd("train", "--resume", str(job_dir), "--no-preflight", "--no-progress"),
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "no usable checkpoint" in refused.stderr
    assert str(newest) in refused.stderr and str(older[-1]) in refused.stderr
    older[-1].write_bytes(intact[older[-1]])  # the previous one repaired: the resume falls back to it

    # (the rest of the 120 epochs without a checkpoint every 4 steps: the fallback is the resume's start)
    resumed = subprocess.run(flextrain_cmd("train", "--resume", str(job_dir), "--no-preflight", "--no-progress",
                                           "--checkpoint-steps", "200"),
                             capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr
    told = " ".join(read_status(job_dir)["events"]) + resumed.stderr
    assert f"{newest}: state blob checksum mismatch" in told and f"using {older[-1]}" in told
    seen, version = seen_counts(job_dir)
    assert version == epochs * records // G
    assert seen[:records].min().item() == seen[:records].max().item() == epochs  # each record once per epoch
    assert not seen[records:].any()  # (the counter has room for more records than this data holds)


# ---- status.json, as `flextrain status` reads it ----------------------------------------------
@pytest.mark.parametrize("text, named", [
    ("{truncated", "cannot read"),
    ("[1, 2]", "the file holds a list, not an object"),
    ('{"name": "a", "phase": 3}', "field phase is 3, not str"),
    ('{"name": "a", "phase": "Running", "jobDir": "/j", "epoch": 1, "epochs": 2, "step": 3, "metrics": {}, '
     '"workers": {"active": 1, "desired": "2"}, "progress": {}}', "field workers.desired is '2', not int"),
    ('{"name": "a", "phase": "Running", "jobDir": "/j", "epoch": 1, "epochs": 2, "step": 3, "metrics": {}, '
     '"workers": {"active": 1, "desired": 2}, "progress": {"recordsDone": 1}}', "field progress.recordsTotal is missing"),
])
def test_a_damaged_status_file_is_one_line_naming_the_field(capsys, tmp_path, text, named):
    from flextrain.cli import main

    (tmp_path / "status.json").write_text(text)
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flextrain: error: ") and err.count("\n") == 1, err
    assert str(tmp_path / "status.json") in err and named in err, err
