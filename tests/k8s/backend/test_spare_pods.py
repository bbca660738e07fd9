"""--spare-workers on Kubernetes: the master's pod backend creates the spare's pod labelled
flextrain.dev/spare=true; a scale-up takes it (its label becomes "false", the very pod joins the round)
and a new spare pod is created behind it; at the end the parked spare exits with the job."""

from __future__ import annotations

import json

import grpc
import pytest
from ft_helpers import wait_for

from flextrain.k8s import meta
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e


def test_the_spare_pod_is_labelled_and_taken_on_scale_up(kube_job, node_agent, tmp_path):
    job = kube_job("spares", workers=1, min_workers=1, max_workers=2, spares=1, epochs=1000)
    job.start()
    status_file = tmp_path / "spares" / "status.json"

    def status():
        try:
            return json.loads(status_file.read_text())
        except (OSError, ValueError):
            return {}

    def labels():
        return {p["metadata"]["name"]: p["metadata"]["labels"].get(meta.LABEL_SPARE) for p in job.raw_pods()}

    wait_for(lambda: status().get("spares", {}).get("parked") == 1 and len(status().get("members", [])) == 1,
             timeout=180, what="one worker training and the spare parked")
    assert labels() == {"spares-worker-0": None, "spares-worker-1": "true"}
    with grpc.insecure_channel(f"127.0.0.1:{job.port}") as channel:
        assert pb_grpc.MasterStub(channel).Scale(pb.ScaleRequest(workers=2), timeout=30).accepted
    wait_for(lambda: {m["id"] for m in status().get("members", [])} == {"worker-0", "worker-1"}, timeout=120,
             what="the spare's pod joining the round")
    wait_for(lambda: labels() == {"spares-worker-0": None, "spares-worker-1": "false", "spares-worker-2": "true"},
             timeout=60, what="the taken spare relabelled and a new spare pod")
    assert status()["spares"]["taken"] == 1 and status()["workers"]["desired"] == 2
    wait_for(lambda: status().get("spares", {}).get("parked") == 1, timeout=180, what="the new spare parked")
    job.stop("test done")
    assert job.wait() in (0, 1)  # a stopped job: 1 (resume possible) unless it finished meanwhile
    phases = {p["metadata"]["name"]: p["status"]["phase"] for p in job.raw_pods()}
    assert phases.get("spares-worker-2") in (None, "Succeeded"), node_agent.log("spares-worker-2")
