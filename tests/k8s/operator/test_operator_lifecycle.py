"""Kubernetes' Job lifecycle fields on an ElasticJob: ttlSecondsAfterFinished, activeDeadlineSeconds, backoffLimit."""

from __future__ import annotations

from ft_helpers import wait_for
from test_operator_create import elasticjob
from test_operator_relaunch import fail_pod

from flextrain.k8s import meta
from flextrain.k8s.meta import now_iso


def worker_pod(jobs, job: dict, index: int) -> None:
    """A worker pod as the job's master creates it (labels, owner)."""
    name = job["metadata"]["name"]
    jobs.kube.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{name}-worker-{index}", "namespace": jobs.namespace,
        "labels": meta.labels(name, "worker", index), "ownerReferences": [meta.owner_reference(job)]},
        "spec": {"containers": [{"name": "worker", "image": "flextrain:test"}]}})


def finish(jobs, name: str, phase: str = "Succeeded") -> None:
    """What the master writes when the job ends."""
    jobs.kube.custom.patch_namespaced_custom_object_status(
        meta.GROUP, meta.VERSION, jobs.namespace, meta.PLURAL, name,
        {"status": {"phase": phase, "message": "trained 1 epoch", "completionTime": now_iso()}})


def test_ttl_deletes_pods_and_services_of_a_finished_job_and_keeps_it(operator, jobs):
    jobs.create(elasticjob("kept"))  # no TTL; created first, so the sweep that cleans "done" has passed it
    wait_for(lambda: jobs.master_pods("kept"), timeout=30, what="master pod of the job without TTL")
    finish(jobs, "kept")
    body = elasticjob("done")
    body["spec"]["ttlSecondsAfterFinished"] = 0
    job = jobs.create(body)
    wait_for(lambda: jobs.master_pods("done") and jobs.service("done"), timeout=30, what="master pod and service")
    worker_pod(jobs, job, 0)
    finish(jobs, "done")
    wait_for(lambda: jobs.kube.job_objects(jobs.namespace, "done") == ([], []), timeout=30,
             what="the finished job's pods and services deleted")
    status = jobs.status("done")
    assert status["phase"] == "Succeeded" and status["message"] == "trained 1 epoch"  # the job and status stay
    event = wait_for(lambda: [e for e in jobs.events("done") if e["reason"] == "Cleaned"], timeout=30,
                     what="the Cleaned event")[0]
    assert "deleted pod/done-master-0, pod/done-worker-0, service/done-master" in event["message"]
    assert "secret/done-tls" in event["message"] and jobs.kube.get_secret(jobs.namespace, "done-tls") is None
    assert jobs.kube.get_secret(jobs.namespace, "kept-tls") is not None  # spec.tls (on by default) made both
    assert list(jobs.master_pods("kept")) == [0] and jobs.service("kept")  # without a TTL they stay


def test_active_deadline_fails_the_job_with_deadline_exceeded_and_deletes_its_pods(operator, jobs):
    body = elasticjob("slow")
    body["spec"]["activeDeadlineSeconds"] = 1
    job = jobs.create(body)
    wait_for(lambda: jobs.master_pods("slow"), timeout=30, what="master pod")
    worker_pod(jobs, job, 0)
    status = wait_for(lambda: jobs.status("slow").get("phase") == "Failed" and jobs.status("slow"), timeout=30,
                      what="the job failed at its deadline")
    assert status["message"].startswith("DeadlineExceeded: the job was still running 1s after it started")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["status"] == "True" and conditions["Failed"]["reason"] == "DeadlineExceeded"
    assert conditions["Running"]["status"] == "False" and status["failure"]["kind"] == "DeadlineExceeded"
    wait_for(lambda: jobs.kube.job_objects(jobs.namespace, "slow")[0] == [], timeout=30, what="its pods deleted")
    assert jobs.master_pods("slow") == {}  # deleted, and not relaunched
    assert "DeadlineExceeded" in jobs.reasons("slow")


def test_backoff_limit_stops_master_relaunches(operator, jobs):
    body = elasticjob("flaky")
    body["spec"]["backoffLimit"] = 1
    body["spec"]["replicaSpecs"]["master"] = {"relaunchBudget": 3}  # the older name loses to backoffLimit
    jobs.create(body)
    wait_for(lambda: 0 in jobs.master_pods("flaky"), timeout=30, what="master pod 0")
    fail_pod(jobs, "flaky-master-0")
    wait_for(lambda: 1 in jobs.master_pods("flaky"), timeout=30, what="master pod 1 (the one relaunch allowed)")
    fail_pod(jobs, "flaky-master-1", exit_code=1, reason="Error")
    status = wait_for(lambda: jobs.status("flaky").get("phase") == "Failed" and jobs.status("flaky"), timeout=30,
                      what="the job failed at the backoff limit")
    assert status["message"] == ("master pod flaky-master-1 failed (exit code 1, Error); relaunch budget "
                                 "(spec.backoffLimit = 1) used up")
    assert status["failure"] == {"worker": "flaky-master-1", "kind": "Internal", "exitCode": 1, "reason": "Error",
                                 "message": "master pod flaky-master-1 failed (exit code 1, Error)"}
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert sorted(jobs.master_pods("flaky")) == [0, 1]
    assert "BackoffLimitExceeded" in wait_for(lambda: jobs.reasons("flaky"), timeout=10, what="events")
