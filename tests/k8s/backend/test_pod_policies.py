"""Relaunch policy of the pod backend with a real master: OOMKilled pods and Pending pods."""

from __future__ import annotations

from pathlib import Path

import pytest
from ft_helpers import read_status, wait_for
from nodeagent import NodeAgent

pytestmark = pytest.mark.e2e
SLOW_DIGITS = Path(__file__).resolve().parents[1] / "e2e" / "zoo" / "slow_digits.py"


def test_oomkilled_worker_is_not_relaunched_forever(kube_job, node_agent):
    job = kube_job("digits", workers=1, epochs=50)
    job.start()
    for k in range(3):  # DEFAULT_MAX_OOM_KILLS = 2: the third OOM kill ends the job
        pod = f"digits-worker-{k}"
        wait_for(lambda pod=pod: pod in node_agent.running(), timeout=60, what=f"{pod} running")
        node_agent.oom_kill(pod)
    assert job.wait() == 1
    status = job.status()
    assert status["phase"] == "Failed"
    assert "OOMKilled 3 times" in status["message"]
    assert "spec.replicaSpecs.worker.resources.limits.memory" in status["message"]
    assert "maxMicroBatch" in status["message"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Failed"] == "True"
    # relaunched twice, then no more pods; of the failed ones only the latest is kept
    assert node_agent.started_pods == [f"digits-worker-{k}" for k in range(3)]
    wait_for(lambda: [p["metadata"]["name"] for p in job.raw_pods()] == ["digits-worker-2"], timeout=30,
             what="the earlier failed pods deleted")


def test_pending_pod_does_not_block_training_with_min_workers(kube_job, k8s_cluster, tmp_path):
    # A node with room for two pods: the third worker pod stays Pending (Unschedulable).
    agent = NodeAgent(k8s_cluster.api_client(), kubeconfig=k8s_cluster.kubeconfig, log_dir=tmp_path / "pods",
                      max_pods=2).start()
    try:
        # Slow batches: training must outlast the look at the pending pod below.
        job = kube_job("digits", model_def=f"{SLOW_DIGITS}:Model", workers=3, min_workers=2, max_workers=3, epochs=3,
                       rendezvous_timeout=2.0)
        job.start()

        def training_while_pending():
            if job.status().get("progress", {}).get("recordsDone", 0) == 0:
                return None
            pod = {p["metadata"]["name"]: p for p in job.raw_pods()}["digits-worker-2"]
            return pod if pod["status"]["phase"] == "Pending" else None

        pending = wait_for(training_while_pending, timeout=120, what="training while digits-worker-2 is Pending")
        assert pending["status"]["conditions"][0]["reason"] == "Unschedulable"
        assert job.wait() == 0
        history = read_status(Path(job.spec.job_dir))["roundHistory"]
        assert sorted(m["id"] for m in history[0]["members"]) == ["worker-0", "worker-1"]  # without the pending one
        assert job.status()["phase"] == "Succeeded" and job.status()["progress"]["percent"] == 100.0
    finally:
        agent.close()
