"""Relaunch policy of the pod backend with a real master: OOMKilled pods and Pending pods."""

from __future__ import annotations

from pathlib import Path

import pytest
from ft_helpers import read_status, wait_for
from nodeagent import NodeAgent

pytestmark = pytest.mark.e2e


def test_oomkilled_worker_climbs_the_memory_ladder_then_halves_m_then_fails_at_one(kube_job, node_agent):
    job = kube_job("digits", workers=1, epochs=50, max_micro_batch=2, relaunch_budget=5,
                   pod_fields={"replicaSpecs.worker.resources": {"limits": {"memory": "1Gi"}},
                               "replicaSpecs.worker.memoryLadder": ["2Gi", "4Gi"]})
    job.start()
    memory = {}
    for k in range(4):  # 1Gi -> 2Gi -> 4Gi (the ladder), then M 2 -> 1, then M=1 killed: the job fails
        pod = f"digits-worker-{k}"
        wait_for(lambda pod=pod: pod in node_agent.running(), timeout=60, what=f"{pod} running")
        spec = {p["metadata"]["name"]: p for p in job.raw_pods()}[pod]["spec"]["containers"][0]["resources"]
        memory[pod] = (spec["limits"]["memory"], spec.get("requests", {}).get("memory"))
        node_agent.oom_kill(pod)
    assert job.wait() == 1
    assert memory == {"digits-worker-0": ("1Gi", None), "digits-worker-1": ("2Gi", "2Gi"),
                      "digits-worker-2": ("4Gi", "4Gi"), "digits-worker-3": ("4Gi", "4Gi")}
    status = job.status()
    assert status["phase"] == "Failed"
    assert "OOMKilled (out of memory) at the smallest micro-batch 1" in status["message"]
    assert status["failure"]["reason"] == "OOMKilled"
    events = " | ".join(read_status(Path(job.spec.job_dir))["events"])
    assert "memory 2Gi (replicaSpecs.worker.memoryLadder)" in events and "micro-batch 2 -> 1" in events
    assert node_agent.started_pods == [f"digits-worker-{k}" for k in range(4)]


def test_pending_pod_does_not_block_training_with_min_workers(kube_job, k8s_cluster, tmp_path, slow_digits):
    # A node with room for two pods: the third worker pod stays Pending (Unschedulable).
    agent = NodeAgent(k8s_cluster.api_client(), kubeconfig=k8s_cluster.kubeconfig, log_dir=tmp_path / "pods",
                      max_pods=2).start()
    try:
        # Slow batches: training must outlast the look at the pending pod below.
        job = kube_job("digits", model_def=slow_digits.model_def, pod_fields=slow_digits.pod_fields, workers=3,
                       min_workers=2, max_workers=3, epochs=3, rendezvous_timeout=2.0)
        job.start()

        def training_while_pending():
            if job.status().get("progress", {}).get("recordsDone", 0) == 0:
                return None
            pod = {p["metadata"]["name"]: p for p in job.raw_pods()}["digits-worker-2"]
            return pod if pod["status"]["phase"] == "Pending" else None

        pending = wait_for(training_while_pending, timeout=120, what="training while digits-worker-2 is Pending")
        assert pending["status"]["conditions"][0]["reason"] == "Unschedulable"
        slow_digits.calm.touch()
        assert job.wait() == 0
        history = read_status(Path(job.spec.job_dir))["roundHistory"]
        assert sorted(m["id"] for m in history[0]["members"]) == ["worker-0", "worker-1"]  # without the pending one
        assert job.status()["phase"] == "Succeeded" and job.status()["progress"]["percent"] == 100.0
    finally:
        agent.close()
