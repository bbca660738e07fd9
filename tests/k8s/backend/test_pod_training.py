"""A real master with the pod backend trains digits in Pods run by the node agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ft_helpers import read_status, wait_for
from kubernetes import client

from flextrain.k8s import meta

pytestmark = pytest.mark.e2e

RECORDS = 1438  # digits training records


def env_of(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_workers_run_as_pods_and_the_cr_status_ends_succeeded(kube_job, node_agent):
    job = kube_job("digits", workers=2, epochs=2, pod_fields={
        "replicaSpecs.worker.resources": {"limits": {"memory": "2Gi", "cpu": "1"}},
        "replicaSpecs.worker.priorityClassName": "training-low",
        "replicaSpecs.worker.env": [{"name": "EXTRA", "value": "1"},
                                    {"name": meta.ENV_ROLE, "value": "not-a-worker"}],
    })
    owner = job.resource()["metadata"]
    assert job.start().wait() == 0

    pods = sorted(job.raw_pods(), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == ["digits-worker-0", "digits-worker-1"]
    for i, pod in enumerate(pods):
        md, spec = pod["metadata"], pod["spec"]
        assert md["labels"] == {meta.LABEL_JOB: "digits", meta.LABEL_ROLE: "worker", meta.LABEL_INDEX: str(i),
                                meta.LABEL_MANAGED_BY: "flextrain"}
        assert md["ownerReferences"] == [{"apiVersion": meta.API_VERSION, "kind": meta.KIND, "name": "digits",
                                          "uid": owner["uid"], "controller": True, "blockOwnerDeletion": True}]
        assert spec["restartPolicy"] == "Never" and spec["serviceAccountName"] == meta.JOB_SERVICE_ACCOUNT
        assert spec["priorityClassName"] == "training-low"
        container = spec["containers"][0]
        assert container["image"] == "flextrain:test" and container["command"] == ["flextrain"]
        assert container["resources"] == {"limits": {"memory": "2Gi", "cpu": "1"}}
        # workers dial the master Service's clusterIP and port
        assert container["args"] == ["worker", "--master", f"127.0.0.1:{job.port}", "--worker-id", f"worker-{i}"]
        env = env_of(pod)
        assert env[meta.ENV_ROLE] == "worker"  # the user's env cannot change the pod's identity
        assert env["EXTRA"] == "1" and env[meta.ENV_INSTANCE_ID] == f"worker-{i}"
        assert env[meta.ENV_JOB_NAME] == "digits" and env[meta.ENV_NAMESPACE] == "default"
        assert env[meta.ENV_MASTER_ADDR] == f"127.0.0.1:{job.port}"
        assert env[meta.ENV_POD_IP] == {"fieldRef": {"fieldPath": "status.podIP"}}
        # each worker exited by itself once the job was done
        assert pod["status"]["phase"] == "Succeeded", node_agent.log(md["name"])

    status = job.status()
    assert status["phase"] == "Succeeded"
    assert status["progress"] == {"recordsDone": 2 * RECORDS, "recordsTotal": 2 * RECORDS, "percent": 100.0,
                                  "summary": "100.0%"}
    assert 0 < status["metrics"]["loss"] < 2.3
    assert status["workers"]["desired"] == 2 and status["selector"] == "flextrain.dev/job=digits,flextrain.dev/role=worker"
    assert status["epoch"] == 2 and status["startTime"] and status["completionTime"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Running": "False", "Succeeded": "True"}


def test_deleted_worker_pod_is_replaced_and_training_completes(kube_job, node_agent, k8s_api, slow_digits):
    # Slow batches: the plain digits job can finish between two polls of the CR (see below).
    job = kube_job("digits", model_def=slow_digits.model_def, pod_fields=slow_digits.pod_fields, workers=2, epochs=6)
    job.start()
    # wait until both workers train (the CR shows a round with two members)
    wait_for(lambda: job.status().get("workers", {}).get("active") == 2
             and job.status()["progress"]["recordsDone"] > 0, timeout=120, what="two workers training")
    client.CoreV1Api(k8s_api).delete_namespaced_pod("digits-worker-1", "default",
                                                    body=client.V1DeleteOptions(grace_period_seconds=0))
    wait_for(lambda: "digits-worker-2" in node_agent.running(), timeout=120, what="the replacement pod running")
    slow_digits.calm.touch()
    assert job.wait() == 0
    names = sorted(p["metadata"]["name"] for p in job.raw_pods())
    assert "digits-worker-2" in names and "digits-worker-1" not in names  # replaced by a new pod
    status = job.status()
    assert status["phase"] == "Succeeded" and status["progress"]["percent"] == 100.0
    events = json.dumps(read_status(Path(job.spec.job_dir))["events"])
    assert "worker-1 exited with code 137" in events  # a deleted pod's container counts as SIGKILLed


def test_preempted_worker_pod_is_replaced(kube_job, node_agent, slow_digits):
    # Slow batches: the job must still be training when both workers are seen and one is preempted.
    job = kube_job("digits", model_def=slow_digits.model_def, pod_fields=slow_digits.pod_fields, workers=2, epochs=6)
    job.start()
    wait_for(lambda: job.status().get("workers", {}).get("active") == 2
             and job.status()["progress"]["recordsDone"] > 0, timeout=120, what="two workers training")
    node_agent.preempt("digits-worker-0", grace_seconds=5)  # SIGTERM first, as the scheduler's eviction
    wait_for(lambda: "digits-worker-2" in node_agent.running(), timeout=120, what="the replacement pod running")
    slow_digits.calm.touch()
    assert job.wait() == 0
    names = sorted(p["metadata"]["name"] for p in job.raw_pods())
    assert "digits-worker-2" in names and "digits-worker-0" not in names
    events = json.dumps(read_status(Path(job.spec.job_dir))["events"])
    assert "worker-0 exited with code 143" in events  # terminated by SIGTERM within its grace period
    assert job.status()["phase"] == "Succeeded"
