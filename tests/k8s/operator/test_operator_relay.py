"""Replica changes and stop requests reach the master over gRPC through its Service.

The master here is a gRPC ``Master`` service on loopback that records what it
is asked (the real master's Scale/Stop are covered by the local e2e tests and
by tests/k8s/e2e); the operator, its Service lookup and its gRPC client are real. These jobs turn
``spec.tls`` off (the recording master serves plaintext); the relay over TLS with the job's Secret is
tests/k8s/operator/test_operator_tls.py's.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures

import grpc
import pytest
from ft_helpers import free_port, wait_for
from test_operator_create import elasticjob

from flextrain.k8s import meta
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc


class RecordingMaster(pb_grpc.MasterServicer):
    def __init__(self, *, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.scales: list[int] = []
        self.stops: list[str] = []
        self.lock = threading.Lock()

    def Scale(self, request, context):
        with self.lock:
            self.scales.append(request.workers)
        if not self.lo <= request.workers <= self.hi:
            return pb.ScaleResponse(accepted=False, message=f"the job allows {self.lo}..{self.hi}")
        return pb.ScaleResponse(accepted=True, message=f"scaling to {request.workers} workers")

    def Stop(self, request, context):
        with self.lock:
            self.stops.append(request.reason)
        return pb.StopResponse(accepted=True, message="stopping at the next step boundary")


@pytest.fixture
def master():
    port = free_port()
    servicer = RecordingMaster(lo=1, hi=3)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    servicer.port = port
    yield servicer
    server.stop(grace=None)


def plaintext(body: dict) -> dict:
    body["spec"]["tls"] = False
    return body


def started_job(jobs, master, name="digits", **worker):
    """A job whose creation the operator has fully handled (kopf recorded its configuration)."""
    body = plaintext(elasticjob(name, **worker))
    body["metadata"]["annotations"] = {meta.ANNOTATION_MASTER_PORT: str(master.port)}
    jobs.create(body)
    wait_for(lambda: jobs.service(name), timeout=30, what="the master service")
    wait_for(lambda: "kopf.zalando.org/last-handled-configuration" in jobs.get(name)["metadata"]["annotations"],
             timeout=30, what="the operator to finish handling the creation")


def report_running(jobs, name: str, desired: int) -> None:
    """What a running master writes into its job's status."""
    jobs.kube.custom.patch_namespaced_custom_object_status(
        meta.GROUP, meta.VERSION, jobs.namespace, meta.PLURAL, name,
        {"status": {"phase": "Running", "workers": {"desired": desired, "active": desired}}})


def test_replica_change_is_relayed_to_the_master(operator, jobs, master):
    started_job(jobs, master)
    jobs.patch("digits", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
    wait_for(lambda: master.scales == [3], timeout=30, what="Scale(3) at the master")
    event = wait_for(lambda: [e for e in jobs.events("digits") if e["reason"] == "Scaling"],
                     timeout=30, what="a Scaling event")[0]
    assert event["message"] == "workers 2 -> 3: scaling to 3 workers"


def test_running_master_behind_the_spec_is_brought_in_line(operator, jobs, master):
    """A change the edge-triggered handler cannot see (made while the job was being created)."""
    body = plaintext(elasticjob("quick"))
    body["metadata"]["annotations"] = {meta.ANNOTATION_MASTER_PORT: str(master.port)}
    jobs.create(body)
    jobs.patch("quick", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
    wait_for(lambda: jobs.status("quick").get("phase") == "Pending", timeout=30, what="the job created")
    report_running(jobs, "quick", desired=2)  # the master started with the old count
    wait_for(lambda: 3 in master.scales, timeout=30, what="Scale(3) at the master")


def test_refusal_by_the_master_is_reported(operator, jobs, master):
    master.hi = 2  # the running master was started with a smaller range
    started_job(jobs, master)
    jobs.patch("digits", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
    event = wait_for(lambda: [e for e in jobs.events("digits") if e["reason"] == "ScaleRejected"],
                     timeout=30, what="a ScaleRejected event")[0]
    assert event["message"] == "the master refused workers 2 -> 3: the job allows 1..2"


def test_stop_annotation_is_relayed(operator, jobs, master):
    started_job(jobs, master)
    jobs.patch("digits", {"metadata": {"annotations": {meta.ANNOTATION_STOP: "stopped by alice"}}})
    wait_for(lambda: master.stops == ["stopped by alice"], timeout=30, what="Stop at the master")
    wait_for(lambda: "StopRequested" in jobs.reasons("digits"), timeout=30, what="a StopRequested event")


def test_unreachable_master_is_retried_until_it_answers(operator, jobs, caplog):
    caplog.set_level(logging.INFO, logger="flextrain.operator.relay")
    port = free_port()  # nothing listens here yet
    late = RecordingMaster(lo=1, hi=3)
    late.port = port
    started_job(jobs, late, name="late")
    jobs.patch("late", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
    wait_for(lambda: any(f"master at 127.0.0.1:{port} unavailable" in r.getMessage() for r in caplog.records),
             timeout=30, what="a failed relay attempt")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_MasterServicer_to_server(late, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        wait_for(lambda: late.scales[-1:] == [3], timeout=60, what="Scale(3) once the master is up")
    finally:
        server.stop(grace=None)


def test_stop_reaches_a_master_relaunched_after_it(operator, jobs, master):
    started_job(jobs, master)
    report_running(jobs, "digits", desired=2)
    jobs.patch("digits", {"metadata": {"annotations": {meta.ANNOTATION_STOP: "enough"}}})
    wait_for(lambda: master.stops == ["enough"], timeout=30, what="Stop at the first master")
    # The master died before concluding; its relaunch (same Service) runs and must stop too.
    jobs.kube.patch_status(jobs.get("digits"), {"masterRelaunches": 1})
    wait_for(lambda: master.stops == ["enough", "enough"], timeout=30, what="Stop at the relaunched master")
