"""A master pod that dies or vanishes before its job ended is relaunched, within a budget."""

from __future__ import annotations

import logging

from ft_helpers import scrape, wait_for
from test_operator_create import elasticjob


def fail_pod(jobs, name: str, *, exit_code: int = 137, reason: str = "OOMKilled") -> None:
    """Write back what a kubelet reports when the master's container dies."""
    jobs.kube.core.patch_namespaced_pod_status(name, jobs.namespace, {"status": {
        "phase": "Failed",
        "containerStatuses": [{"name": "master", "ready": False, "restartCount": 0, "image": "flextrain:test",
                               "imageID": "", "state": {"terminated": {"exitCode": exit_code, "reason": reason}}}],
    }})


def delete_pod(jobs, name: str) -> None:
    jobs.kube.core.delete_namespaced_pod(name, jobs.namespace)


def job_with_budget(name: str, budget: int) -> dict:
    body = elasticjob(name)
    body["spec"]["replicaSpecs"]["master"] = {"relaunchBudget": budget}
    return body


def test_deleted_then_failed_master_is_relaunched_until_the_budget_is_used_up(operator, jobs):
    jobs.create(job_with_budget("digits", 2))
    wait_for(lambda: 0 in jobs.master_pods("digits"), timeout=30, what="master pod 0")
    # The operator writes the job's status just after it made the pod: until then the job has no master
    # of record, and a pod gone meanwhile is a first master still to create (pod 0 again), not a relaunch.
    wait_for(lambda: jobs.status("digits").get("masterRelaunches") == 0, timeout=30, what="the operator's status")

    delete_pod(jobs, "digits-master-0")
    pods = wait_for(lambda: 1 in jobs.master_pods("digits") and jobs.master_pods("digits"),
                    timeout=30, what="master pod 1 after deleting pod 0")
    assert pods[1]["metadata"]["ownerReferences"][0]["name"] == "digits"
    status = wait_for(lambda: jobs.status("digits").get("masterRelaunches") == 1 and jobs.status("digits"),
                      timeout=30, what="masterRelaunches 1")
    assert "digits-master-0 was deleted: relaunched as digits-master-1 (1/2)" in status["message"]

    fail_pod(jobs, "digits-master-1")
    pods = wait_for(lambda: 2 in jobs.master_pods("digits") and jobs.master_pods("digits"),
                    timeout=30, what="master pod 2 after pod 1 failed")
    assert pods[1]["status"]["phase"] == "Failed"  # kept for `kubectl logs`

    fail_pod(jobs, "digits-master-2", exit_code=1, reason="Error")
    status = wait_for(lambda: jobs.status("digits").get("phase") == "Failed" and jobs.status("digits"),
                      timeout=30, what="the job to fail once the budget is used up")
    assert status["message"] == ("master pod digits-master-2 failed (exit code 1, Error); relaunch budget "
                                 "(spec.replicaSpecs.master.relaunchBudget = 2) used up")
    assert 3 not in jobs.master_pods("digits")
    reasons = wait_for(lambda: (r := jobs.reasons("digits")).count("MasterRelaunched") == 2
                       and "MasterFailed" in r and r, timeout=30, what="relaunch and failure events")
    assert reasons.count("MasterCreated") == 1
    relaunched = [e for e in jobs.events("digits") if e["reason"] == "MasterRelaunched"]
    assert "exit code 137, OOMKilled" in relaunched[1]["message"]
    # The operator's own metrics, scraped and parsed as Prometheus would.
    scraped = wait_for(lambda: (m := scrape(f"http://127.0.0.1:{operator.metrics.port}/metrics"))
                       [("flextrain_operator_jobs", (("phase", "Failed"),))] == 1 and m,
                       timeout=30, what="a sweep counting the failed job")
    assert scraped[("flextrain_operator_master_relaunches_total", ())] == 2
    assert scraped[("flextrain_operator_jobs", (("phase", "Running"),))] == 0


def test_master_of_a_finished_job_is_not_relaunched(operator, jobs, caplog):
    caplog.set_level(logging.INFO, logger="flextrain.operator.handlers")
    jobs.create(job_with_budget("done", 3))
    wait_for(lambda: 0 in jobs.master_pods("done"), timeout=30, what="master pod 0")
    # after the operator's own status for the new pod (it would otherwise write Pending over the master's)
    wait_for(lambda: jobs.status("done").get("masterRelaunches") == 0, timeout=30, what="the operator's status")
    # What the master writes before it exits with the job's outcome.
    jobs.kube.custom.patch_namespaced_custom_object_status(
        "flextrain.dev", "v1alpha1", jobs.namespace, "elasticjobs", "done",
        {"status": {"phase": "Failed", "message": "training data is corrupt"}})
    fail_pod(jobs, "done-master-0", exit_code=1, reason="Error")
    # The operator's decision on that pod event, as it logs it.
    wait_for(lambda: any("master pod done-master-0 MODIFIED (phase Failed): job done over" in r.getMessage()
                         for r in caplog.records), timeout=30, what="the operator's decision on the failed pod")
    assert list(jobs.master_pods("done")) == [0]
    assert jobs.status("done")["message"] == "training data is corrupt"
    assert "MasterRelaunched" not in jobs.reasons("done")
