"""Hostile and malformed requests sent to a real master gRPC server on loopback, through generic stubs.

Each is refused with INVALID_ARGUMENT naming the field and its bound (or, above
the message size limit, RESOURCE_EXHAUSTED from gRPC itself), and changes
nothing: the ledger, the workers and the job directory stay as they were, and
the master goes on serving the real workers' calls.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import grpc
import pytest

from flextrain.data import Shard
from flextrain.job import JobSpec
from flextrain.master.coordinator import JobMaster
from flextrain.master.ledger import TaskLedger
from flextrain.master.servicer import MasterServicer, start_server
from flextrain.proto import flextrain_pb2 as pb
from flextrain.protocol.limits import MAX_AHEAD_COUNT, MAX_MASTER_MESSAGE, MAX_METRIC_VALUES, MAX_TEXT_CHARS
from flextrain.worker.client import MasterClient

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def master(tmp_path):
    """A served JobMaster (2 workers registered, in a round, worker-0 holding a 2-step task), a raw channel."""
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=10, steps_per_task=2, workers=2).validate()
    ledger = TaskLedger(shards=[Shard("s.rio", 0, 400)], epochs=1, global_batch_size=10, steps_per_task=2,
                        renew_ids=True)
    job = JobMaster(spec, ledger)
    scaled = []
    servicer = MasterServicer(job, status_json=lambda: "{}", stop=lambda reason: (False, ""),
                              scale=lambda n: (scaled.append(n), (True, ""))[1], heartbeat_interval=1.0)
    server, port = start_server(servicer, host="127.0.0.1", port=0, threads=2)
    clients = [MasterClient(f"127.0.0.1:{port}", f"worker-{i}") for i in range(2)]
    for c in clients:
        c.register(pid=1)
    answers = {}
    threads = [threading.Thread(target=lambda c=c: answers.update({c.worker_id: c.join(pb.Position(round_id=-1),
                                                                                          "start")}))
               for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    rid = answers["worker-0"].round_id
    task = clients[0].get_task(round_id=rid, task_index=0, position=pb.Position(round_id=rid)).task
    raw = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)])
    yield job, clients, raw, rid, task, scaled
    raw.close()
    for c in clients:
        c.close()
    server.stop(grace=None)


def call(raw, method: str, request):
    stub = raw.unary_unary(f"/flextrain.v1.Master/{method}", request_serializer=lambda r: r.SerializeToString(),
                           response_deserializer=lambda b: b)
    return stub(request, timeout=20)


def job_state(job: JobMaster) -> tuple:
    with job.cond:
        ledger = json.dumps(job.ledger.to_dict(), sort_keys=True)
        workers = sorted((w, str(i.position)) for w, i in job.workers.items())
        files = sorted(str(p) for p in Path(job.spec.job_dir).rglob("*"))
        return ledger, workers, job.over, job.recorded_version, files


def bad_requests(job: JobMaster, task: pb.Task, rid: int):
    ckpt = Path(job.spec.checkpoint_dir)
    long = "x" * (MAX_TEXT_CHARS + 1)
    return [
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="w" * 300), "worker_id: 300 characters, at most 253"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="w", pid=-1), "pid: -1 must be >= 0"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="w", probe=pb.MicroBatchProbe(max_micro_batch=-4)),
         "probe.max_micro_batch: -4"),
        ("RegisterWorker", pb.RegisterWorkerRequest(worker_id="w", node_check=pb.NodeCheck(
            seconds_per_sample=math.nan)), "node_check.seconds_per_sample: nan must be a finite number"),
        ("Park", pb.ParkRequest(worker_id="w", pid=-7), "pid: -7"),
        ("Heartbeat", pb.HeartbeatRequest(worker_id="worker-0", position=pb.Position(round_id=rid, task_index=-3)),
         "position.task_index: -3"),
        ("Heartbeat", pb.HeartbeatRequest(worker_id="worker-0", position=pb.Position(round_id=-9)),
         "position.round_id: -9 must be >= -1"),
        ("Heartbeat", pb.HeartbeatRequest(worker_id="worker-0", compute_seconds=math.inf), "compute_seconds: inf"),
        ("Heartbeat", pb.HeartbeatRequest(worker_id="worker-0", samples=-1), "samples: -1"),
        ("Heartbeat", pb.HeartbeatRequest(worker_id="worker-0", memory=pb.MemorySample(used_bytes=-1)),
         "memory.used_bytes: -1"),
        ("GetTask", pb.GetTaskRequest(worker_id="worker-1", round_id=rid, task_index=1, ahead=True,
                                      ahead_count=10**6), f"ahead_count: 1000000 must be in [0, {MAX_AHEAD_COUNT}]"),
        ("GetTask", pb.GetTaskRequest(worker_id="worker-1", round_id=rid, task_index=-1), "task_index: -1"),
        ("GetTask", pb.GetTaskRequest(worker_id="worker-1", round_id=rid, kind=9), "kind: 9 is not a Task.Kind"),
        ("GetTask", pb.GetTaskRequest(worker_id="worker-1", round_id=rid, model_version=-2), "model_version: -2"),
        ("ReportTask", pb.ReportTaskRequest(worker_id="worker-0", task_id=-1, ok=True), "task_id: -1"),
        ("ReportTask", pb.ReportTaskRequest(worker_id="worker-0", task_id=task.task_id, ok=False, steps_done=10**9),
         f"steps_done: 1000000000 exceeds the 2 step(s) of task {task.task_id}"),
        ("ReportTask", pb.ReportTaskRequest(worker_id="worker-0", task_id=task.task_id, ok=False, steps_done=-1),
         "steps_done: -1"),
        ("ReportTask", pb.ReportTaskRequest(worker_id="worker-0", task_id=task.task_id, ok=False, error=long),
         f"error: {MAX_TEXT_CHARS + 1} characters"),
        ("ReportTask", pb.ReportTaskRequest(worker_id="worker-0", task_id=task.task_id, ok=True, metric_states={
            "auc": pb.MetricState(kind="auc", values=[0.0] * (MAX_METRIC_VALUES + 1))}), "metric_states[auc] values"),
        ("ReportCheckpoint", pb.ReportCheckpointRequest(worker_id="worker-0", path="/etc/passwd", final=True),
         "path: '/etc/passwd' is not a file in the job's checkpoint directory"),
        ("ReportCheckpoint", pb.ReportCheckpointRequest(worker_id="worker-0", path=str(ckpt / ".." / ".." / "x.ckpt")),
         "is not a file in the job's checkpoint directory"),
        ("ReportCheckpoint", pb.ReportCheckpointRequest(worker_id="worker-0", path=str(ckpt / "c.ckpt"),
                                                        ledger_json="[1, 2]"), "ledger_json: must be a JSON object"),
        ("ReportCheckpoint", pb.ReportCheckpointRequest(worker_id="worker-0", path=str(ckpt / "c.ckpt"),
                                                        ledger_json="{nope"), "ledger_json: not JSON"),
        ("ReportFailure", pb.ReportFailureRequest(worker_id="worker-0", failure=pb.Failure(traceback=long)),
         "failure.traceback"),
        ("Accelerate", pb.AccelerateRequest(worker_id="worker-0", strategy_json="__import__('os')"),
         "strategy_json: not JSON"),
        ("JoinRendezvous", pb.JoinRendezvousRequest(worker_id="worker-0", position=pb.Position(version=-5)),
         "position.version: -5"),
        ("Scale", pb.ScaleRequest(workers=-1), "workers: -1 must be in [0, 100000]"),
        ("Stop", pb.StopRequest(reason=long), "reason:"),
    ]


def test_out_of_bound_fields_are_refused_and_change_nothing(master):
    job, clients, raw, rid, task, scaled = master
    before = job_state(job)
    for method, request, says in bad_requests(job, task, rid):
        with pytest.raises(grpc.RpcError) as err:
            call(raw, method, request)
        assert err.value.code() == INVALID, (method, err.value.code(), err.value.details())
        assert says in err.value.details() and err.value.details().startswith(method), (says, err.value.details())
        assert job_state(job) == before, (method, says)
    assert not scaled and not job.over
    # The real workers carry on: the task is still worker-0's, and reporting it works.
    assert task.task_id in job.ledger.doing
    clients[0].report_task(task.task_id, ok=False, steps_done=1, error="a real failure")
    assert task.task_id not in job.ledger.doing and job.ledger.records_done == 10


def test_checkpoints_where_workers_write_them_are_accepted(master):
    from types import SimpleNamespace

    from flextrain.master.wire_checks import Refused, check

    job, clients, raw, rid, task, scaled = master
    path = Path(job.spec.checkpoint_dir) / "ckpt-000000000.ckpt"
    call(raw, "ReportCheckpoint", pb.ReportCheckpointRequest(worker_id="worker-0", path=str(path),  # raises if refused
                                                            position=pb.Position(round_id=rid)))
    # A relative job directory: workers name the file as Path(job_dir) / "checkpoints" / name does.
    relative = SimpleNamespace(spec=SimpleNamespace(checkpoint_dir=Path("./jobs/j") / "checkpoints"))
    check("ReportCheckpoint", pb.ReportCheckpointRequest(path=str(Path("./jobs/j") / "checkpoints" / "final.ckpt")),
          relative)
    with pytest.raises(Refused, match="checkpoint directory"):
        check("ReportCheckpoint", pb.ReportCheckpointRequest(path="jobs/other/checkpoints/final.ckpt"), relative)


def test_a_message_above_the_limit_is_refused_by_grpc(master):
    job, clients, raw, rid, task, scaled = master
    before = job_state(job)
    with pytest.raises(grpc.RpcError) as err:
        call(raw, "ReportCheckpoint", pb.ReportCheckpointRequest(worker_id="worker-0",
                                                                ledger_json="{" + " " * MAX_MASTER_MESSAGE + "}"))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert job_state(job) == before
    assert clients[0].heartbeat(pb.Position(round_id=rid), 0.5, 10).stop is False
