"""A job history's metrics record of a trained step waits for the workers' loss of it (a real JobMaster,
its StatusReporter and HistoryRecorder, driven directly)."""

from __future__ import annotations

from flextrain.data import Shard
from flextrain.job import JobSpec
from flextrain.master.coordinator import JobMaster
from flextrain.master.history import HistoryRecorder, read_events
from flextrain.master.ledger import TaskLedger
from flextrain.master.status import StatusReporter
from flextrain.proto import flextrain_pb2 as pb


def test_a_trained_steps_record_waits_for_its_loss(tmp_path):
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=10, tensorboard=False).validate()
    job = JobMaster(spec, TaskLedger(shards=[Shard("s.rio", 0, 40)], epochs=1, global_batch_size=10,
                                     steps_per_task=2))
    history = HistoryRecorder(job, path=tmp_path / "events.jsonl", resume=False, interval=0)
    reporter = StatusReporter(job, path=tmp_path / "status.json", desired=lambda: 1, master_address="127.0.0.1:1",
                              show_progress=False, sinks=(history,))
    job.mark_running()
    job.register("w0")
    reporter.update()  # step 0: nothing trained, no loss to wait for
    job.heartbeat(pb.HeartbeatRequest(worker_id="w0", position=pb.Position(round_id=0, version=3)))
    reporter.update()  # step 3 known (as from a task call), its loss not yet: held
    reporter.update()
    job.heartbeat(pb.HeartbeatRequest(worker_id="w0", position=pb.Position(round_id=0, version=3), loss=0.5,
                                      samples=30))
    reporter.update()
    history.close()
    assert [(r["step"], r["loss"]) for r in read_events(tmp_path) if r["type"] == "metrics"] == [(0, None), (3, 0.5)]
