"""A job the operator fails ends as every failed job does (flextrain/k8s/job_status.py): condition
``Failed`` (what ``kubectl wait --for=condition=Failed`` waits for) with the reason, ``Running`` False,
``status.failure`` naming the cause, a ``startTime`` not after its ``completionTime``, and no worker pod
left running (``workers.active`` 0)."""

from __future__ import annotations

import datetime

from ft_helpers import wait_for
from test_operator_create import elasticjob
from test_operator_lifecycle import worker_pod

from flextrain.k8s import meta
from flextrain.operator.reconcile import Reconciler


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status.get("conditions") or ()}


def assert_ended_in_order(status: dict) -> None:
    start, end = (datetime.datetime.fromisoformat(status[k].replace("Z", "+00:00"))
                  for k in ("startTime", "completionTime"))
    assert start <= end, (status["startTime"], status["completionTime"])


def test_an_invalid_spec_fails_with_the_failed_condition_and_its_cause(operator, jobs):
    body = elasticjob("typo", minReplicas=5, replicas=3)
    body["metadata"]["generation"] = 4  # an API server sets it; the emulator keeps the one given
    jobs.create(body)
    status = wait_for(lambda: jobs.status("typo").get("phase") == "Failed" and jobs.status("typo"),
                      timeout=30, what="the job to fail")
    problem = "spec.replicaSpecs.worker.minReplicas (5) > replicas (3)"
    failed, running = conditions(status)["Failed"], conditions(status)["Running"]
    assert (failed["status"], failed["reason"], failed["message"]) == ("True", "InvalidSpec", problem)
    assert (running["status"], running["reason"]) == ("False", "InvalidSpec")
    assert status["failure"] == {"kind": "InvalidSpec", "message": problem}
    assert status["observedGeneration"] == 4  # the spec the operator judged
    assert_ended_in_order(status)


def test_a_spec_made_invalid_fails_at_the_relaunch_and_deletes_the_workers(operator, jobs):
    """The master is gone and will not be relaunched: its workers must not train on (or wait for it)."""
    job = jobs.create(elasticjob("edit"))
    wait_for(lambda: 0 in jobs.master_pods("edit"), timeout=30, what="master pod 0")
    worker_pod(jobs, job, 0)
    worker_pod(jobs, job, 1)
    jobs.kube.patch_status(jobs.get("edit"), {  # what a running master writes
        "phase": "Running", "message": "training", "workers": {"desired": 2, "active": 2, "summary": "2/2"},
        "conditions": [{"type": "Running", "status": "True", "reason": "Running",
                        "lastTransitionTime": meta.now_iso()}]})
    jobs.patch("edit", {"spec": {"replicaSpecs": {"worker": {"maxReplicas": 1}}}})
    jobs.kube.core.delete_namespaced_pod("edit-master-0", jobs.namespace)
    status = wait_for(lambda: jobs.status("edit").get("phase") == "Failed" and jobs.status("edit"),
                      timeout=30, what="the job to fail")
    problem = "spec.replicaSpecs.worker.maxReplicas (1) < replicas (2)"
    assert status["message"] == f"{problem} (master pod edit-master-0 was deleted; not relaunched)"
    failed, running = conditions(status)["Failed"], conditions(status)["Running"]
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
    assert running["status"] == "False"  # not the master's stale True
    assert status["failure"] == {"kind": "InvalidSpec", "message": problem}
    assert status["workers"] == {"desired": 2, "active": 0, "summary": "0/2"}
    assert_ended_in_order(status)
    wait_for(lambda: jobs.kube.job_objects(jobs.namespace, "edit")[0] == [], timeout=30,
             what="the worker pods deleted")


def test_the_operator_keeps_the_start_time_of_a_job_its_master_already_ended(k8s_api, jobs):
    """A master quick to fail (preflight) writes Failed before the operator records the master pod's
    creation: that record must not put a startTime after the job's completionTime."""
    job = jobs.create(elasticjob("quick"))
    ended = {"phase": "Failed", "message": "the master cannot start: ...", "startTime": "2026-01-01T00:00:00Z",
             "completionTime": "2026-01-01T00:00:00Z"}
    jobs.kube.patch_status(job, ended)
    Reconciler(jobs.kube)._mark_created(job)
    status = jobs.status("quick")
    assert {k: status[k] for k in ended} == ended and status["masterRelaunches"] == 0
