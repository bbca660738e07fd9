"""A scale the job cannot run is reverted in the spec with one Event; a valid one is relayed once;
a master is not relaunched into a spec it cannot run.

The master is the recording gRPC service of test_operator_relay (it answers
Scale and records it, but writes no status: the tests write what a running
master would). Two barriers replace waiting for "nothing more happens":

* kopf's ``last-handled-configuration`` annotation holds the replicas the
  field handler has finished with; once it shows the reverted value, the
  handler has seen the revert too.
* :func:`after_two_sweeps`: the sweep (every second here) recreates a deleted
  master Service before it syncs the job's replicas, so a Service deleted and
  recreated twice means a whole sweep of the job ran after the call.
"""

from __future__ import annotations

import json

import pytest
from ft_helpers import wait_for
from test_operator_create import elasticjob
from test_operator_relay import master, report_running, started_job  # noqa: F401 - master: a fixture

from flextrain.k8s import meta

LAST_HANDLED = "kopf.zalando.org/last-handled-configuration"


def spec_replicas(jobs, name: str) -> int:
    return jobs.get(name)["spec"]["replicaSpecs"]["worker"]["replicas"]


def handled(jobs, name: str) -> dict:
    """The job as kopf's handlers last finished with it (spec and the status fields they watch)."""
    return json.loads((jobs.get(name)["metadata"].get("annotations") or {}).get(LAST_HANDLED) or "{}")


def handled_replicas(jobs, name: str) -> int | None:
    return ((handled(jobs, name).get("spec") or {}).get("replicaSpecs") or {}).get("worker", {}).get("replicas")


def after_two_sweeps(jobs, name: str) -> None:
    for _ in range(2):
        uid = jobs.service(name)["metadata"]["uid"]
        jobs.kube.core.delete_namespaced_service(meta.master_service_name(name), jobs.namespace)
        wait_for(lambda: (svc := jobs.service(name)) and svc["metadata"]["uid"] != uid, timeout=30,
                 what="the sweep to recreate the master service")


def scale(jobs, name: str, replicas: int) -> None:
    """Where `kubectl scale ej/NAME` writes (the CRD's specReplicasPath)."""
    jobs.patch(name, {"spec": {"replicaSpecs": {"worker": {"replicas": replicas}}}})


def events(jobs, name: str, reason: str) -> list[dict]:
    return [e for e in jobs.events(name) if e["reason"] == reason]


@pytest.mark.parametrize(("requested", "worker", "problem"), [
    (9, {}, "spec.replicaSpecs.worker.maxReplicas (3) < replicas (9)"),
    (1, {"minReplicas": 2}, "spec.replicaSpecs.worker.minReplicas (2) > replicas (1)"),
], ids=["above-max", "below-min"])
def test_out_of_range_scale_is_reverted_with_one_warning(operator, jobs, master, requested, worker, problem):
    started_job(jobs, master, **worker)
    report_running(jobs, "digits", desired=2)
    scale(jobs, "digits", requested)
    wait_for(lambda: handled_replicas(jobs, "digits") == 2 and spec_replicas(jobs, "digits") == 2,
             timeout=30, what="the spec reverted to 2 and the revert handled")
    after_two_sweeps(jobs, "digits")
    rejected = events(jobs, "digits", "ScaleRejected")
    assert len(rejected) == 1, [e["message"] for e in rejected]
    lo = worker.get("minReplicas", 1)
    assert rejected[0]["type"] == "Warning"
    assert rejected[0]["message"] == (
        f"cannot scale workers to {requested}: {problem}; allowed: spec.replicaSpecs.worker.minReplicas"
        f"..maxReplicas = {lo}..3; spec.replicaSpecs.worker.replicas reverted to 2")
    assert master.scales == []  # neither the refused count nor the revert went to the master
    status = jobs.status("digits")
    assert status["phase"] == "Running" and status["masterRelaunches"] == 0  # the job runs on
    assert list(jobs.master_pods("digits")) == [0]


def test_valid_scale_is_relayed_once_with_one_event(operator, jobs, master):
    started_job(jobs, master)
    report_running(jobs, "digits", desired=2)
    scale(jobs, "digits", 3)
    wait_for(lambda: events(jobs, "digits", "Scaling"), timeout=30, what="a Scaling event")
    # The master has not reported desired=3 (it writes no status here): the sweep sees the
    # spec differ from the status and must not send the same request again.
    after_two_sweeps(jobs, "digits")
    assert master.scales == [3]
    assert [e["message"] for e in events(jobs, "digits", "Scaling")] == ["workers 2 -> 3: scaling to 3 workers"]
    assert spec_replicas(jobs, "digits") == 3
    assert events(jobs, "digits", "ScaleRejected") == []


def test_scale_of_a_finished_job_is_reverted_with_one_warning(operator, jobs, master):
    started_job(jobs, master)
    jobs.kube.patch_status(jobs.get("digits"), {  # what a master writes when training ends
        "phase": "Succeeded", "message": "training finished", "workers": {"desired": 2, "active": 0}})
    wait_for(lambda: handled(jobs, "digits").get("status", {}).get("phase") == "Succeeded", timeout=30,
             what="the operator to see the job finished")
    scale(jobs, "digits", 3)  # within minReplicas..maxReplicas
    wait_for(lambda: handled_replicas(jobs, "digits") == 2 and spec_replicas(jobs, "digits") == 2,
             timeout=30, what="the spec reverted to 2 and the revert handled")
    rejected = events(jobs, "digits", "ScaleRejected")
    assert [(e["type"], e["message"]) for e in rejected] == [(
        "Warning", "cannot scale workers to 3: the job has finished (Succeeded); "
                   "spec.replicaSpecs.worker.replicas reverted to 2")]
    assert master.scales == []
    assert jobs.status("digits")["phase"] == "Succeeded"


def test_master_is_not_relaunched_into_an_invalid_spec(operator, jobs):
    """An edit that makes the spec invalid (here maxReplicas below replicas) fails the job at
    the next relaunch, naming the field, instead of a master that exits with code 2 each time."""
    jobs.create(elasticjob("digits"))
    wait_for(lambda: 0 in jobs.master_pods("digits"), timeout=30, what="master pod 0")
    jobs.patch("digits", {"spec": {"replicaSpecs": {"worker": {"maxReplicas": 1}}}})
    jobs.kube.core.delete_namespaced_pod("digits-master-0", jobs.namespace)
    status = wait_for(lambda: jobs.status("digits").get("phase") == "Failed" and jobs.status("digits"),
                      timeout=30, what="the job to fail")
    assert status["message"] == ("spec.replicaSpecs.worker.maxReplicas (1) < replicas (2) "
                                 "(master pod digits-master-0 was deleted; not relaunched)")
    invalid = wait_for(lambda: events(jobs, "digits", "InvalidSpec"), timeout=30, what="an InvalidSpec event")
    assert invalid[0]["type"] == "Warning" and invalid[0]["message"] == status["message"]
    assert jobs.master_pods("digits") == {}
    assert "MasterRelaunched" not in jobs.reasons("digits")


def test_a_refused_revert_is_reported_once_and_nothing_relayed(k8s_cluster, operator, jobs, master):
    started_job(jobs, master)
    report_running(jobs, "digits", desired=2)
    policy = 'admission webhook "frozen-spec.example.com" denied the request: replicas are managed by the team quota'
    k8s_cluster.admit_patch(lambda res, ns, obj, sub, body: (
        (403, "Forbidden", policy) if sub is None and obj == "digits"
        and ((body.get("spec") or {}).get("replicaSpecs") or {}).get("worker", {}).get("replicas") == 2 else None))
    scale(jobs, "digits", 9)
    wait_for(lambda: events(jobs, "digits", "ScaleRejected") and handled_replicas(jobs, "digits") == 9,
             timeout=30, what="a ScaleRejected event and the scale handled")
    after_two_sweeps(jobs, "digits")
    rejected = events(jobs, "digits", "ScaleRejected")
    assert len(rejected) == 1, [e["message"] for e in rejected]
    assert rejected[0]["message"] == (
        "cannot scale workers to 9: spec.replicaSpecs.worker.maxReplicas (3) < replicas (9); allowed: "
        "spec.replicaSpecs.worker.minReplicas..maxReplicas = 1..3; reverting spec.replicaSpecs.worker.replicas "
        f'to 2 failed: cannot patch ElasticJob "digits": the API server refused it (403 Forbidden): {policy}')
    assert spec_replicas(jobs, "digits") == 9 and master.scales == []  # told, and the count not run
