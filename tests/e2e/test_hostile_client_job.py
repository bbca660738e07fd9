"""A ParameterServer job finishes, every record applied exactly once, while a hostile client fires
malformed pushes, pulls and oversized messages at its PS and out-of-bound calls at its master.

Real master, PS and worker processes on loopback; the counting model (tests/e2e/zoo/counting_ps.py)
counts on the PS how often each record was applied.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import grpc
import pytest

from ft_helpers import counting_data, flextrain_cmd, ps_counts, read_status, wait_for
from hostile_wire import Raw, bad_pushes, ids, layout_id_of, tensor

from flextrain.proto import flextrain_pb2 as fpb
from flextrain.proto import ps_pb2 as pb
from flextrain.protocol.limits import MAX_PS_MESSAGE

pytestmark = pytest.mark.e2e

COUNTING_PS = f"{Path(__file__).resolve().parent / 'zoo' / 'counting_ps.py'}:Model"
G, RECORDS, EPOCHS = 32, 1408, 2
REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
GONE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}  # the job ended while a call was under way


def master_calls(rid: int) -> list[tuple[str, object]]:
    """Out-of-bound calls that would each disturb the job if the master took them."""
    return [
        ("GetTask", fpb.GetTaskRequest(worker_id="worker-0", round_id=rid, task_index=0, ahead=True,
                                       ahead_count=10**6)),
        ("GetTask", fpb.GetTaskRequest(worker_id="worker-1", round_id=rid, task_index=-1)),
        ("ReportTask", fpb.ReportTaskRequest(worker_id="worker-0", task_id=0, ok=False, samples=-1)),
        ("ReportTask", fpb.ReportTaskRequest(worker_id="worker-0", task_id=-1, ok=True)),
        ("Heartbeat", fpb.HeartbeatRequest(worker_id="worker-0", position=fpb.Position(round_id=rid, version=-1))),
        ("Heartbeat", fpb.HeartbeatRequest(worker_id="worker-1", compute_seconds=math.nan)),
        ("ReportCheckpoint", fpb.ReportCheckpointRequest(worker_id="worker-0", path="/etc/passwd", final=True)),
        ("ReportCheckpoint", fpb.ReportCheckpointRequest(worker_id="worker-0", ledger_json="[]", path="x")),
        ("RegisterWorker", fpb.RegisterWorkerRequest(worker_id="worker-9", pid=-1)),
        ("Scale", fpb.ScaleRequest(workers=-3)),
    ]


class Hostile:
    """Fires one round of bad calls at a time; counts what came back."""

    def __init__(self, master: str, ps: list[str]) -> None:
        self.master = grpc.insecure_channel(master, options=[("grpc.max_send_message_length", -1)])
        self.ps = [Raw(a) for a in ps]
        self.codes: dict[grpc.StatusCode, int] = {}
        self.taken: set[str] = set()  # the calls answered OK

    def _one(self, call, what: str = "") -> None:
        try:
            call()
        except grpc.RpcError as exc:
            self.codes[exc.code()] = self.codes.get(exc.code(), 0) + 1
        else:
            self.codes[grpc.StatusCode.OK] = self.codes.get(grpc.StatusCode.OK, 0) + 1
            self.taken.add(what)

    def round(self, rid: int) -> bool:
        """One round of bad calls; False once no server answers any more (the job ended)."""
        gone = sum(self.codes.get(c, 0) for c in GONE)
        calls = sum(self.codes.values())
        for raw in self.ps:
            try:
                lid = layout_id_of(raw)
            except grpc.RpcError as exc:  # the job ended meanwhile
                self.codes[exc.code()] = self.codes.get(exc.code(), 0) + 1
                continue
            for case, chunks, _ in bad_pushes(lid):
                self._one(lambda: raw.push(*chunks), case)
            self._one(lambda: raw.stream("PullEmbedding", pb.PullEmbeddingRequest(
                table="seen_rows", ids=ids(3, -1)), pb.PullEmbeddingChunk))
            self._one(lambda: raw.stream("PullEmbedding", pb.PullEmbeddingRequest(
                table="seen_rows", ids=tensor("int64", [2], bytes(15))), pb.PullEmbeddingChunk))
            over = MAX_PS_MESSAGE + 1024
            self._one(lambda: raw.stream("PullEmbedding", pb.PullEmbeddingRequest(
                table="seen_rows", ids=tensor("int64", [over // 8], bytes(over))), pb.PullEmbeddingChunk))
        for method, request in master_calls(rid):
            stub = self.master.unary_unary(f"/flextrain.v1.Master/{method}",
                                           request_serializer=lambda r: r.SerializeToString())
            self._one(lambda: stub(request, timeout=10), method)
        return sum(self.codes.get(c, 0) for c in GONE) - gone < sum(self.codes.values()) - calls

    def close(self) -> None:
        self.master.close()
        for raw in self.ps:
            raw.channel.close()


def test_a_ps_job_under_hostile_traffic_applies_every_record_exactly_once(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data", records=RECORDS)
    job_dir = tmp_path / "job"
    cmd = flextrain_cmd("train", "--model-def", COUNTING_PS, "--training-data", str(data),
                        "--distribution-strategy", "ParameterServer", "--ps", "2", "--workers", "2",
                        "--global-batch-size", str(G), "--lr", str(G), "--epochs", str(EPOCHS),
                        "--job-dir", str(job_dir))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FT_COUNT_RECORDS": str(RECORDS), "FT_FEED_DELAY": "0.02"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    hostile = None
    try:
        wait_for(lambda: (job_dir / "status.json").is_file() and read_status(job_dir)["progress"]["recordsDone"] > 0,
                 timeout=120, what="training under way")
        status = read_status(job_dir)
        addresses = [(job_dir / "ps" / f"ps-{i}.addr").read_text().strip() for i in range(2)]
        hostile = Hostile(status["masterAddress"], addresses)
        rounds = 0
        while proc.poll() is None and hostile.round(rid=0):
            rounds += 1
        _, stderr = proc.communicate(timeout=180)
    finally:
        if hostile is not None:
            hostile.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == EPOCHS * RECORDS
    # Every hostile call was refused (or hit a server already shut down at the end); none taken, none crashed one.
    assert rounds >= 1 and set(hostile.codes) <= REFUSED | GONE, (hostile.codes, hostile.taken)
    assert sum(hostile.codes.get(c, 0) for c in REFUSED) >= len(master_calls(0)) + 2 * len(bad_pushes(0))
    dense, rows = ps_counts(job_dir, RECORDS)
    assert dense.tolist() == [float(EPOCHS)] * RECORDS
    assert rows.tolist() == [float(EPOCHS)] * RECORDS
