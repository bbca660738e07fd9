"""A master pod the API server refuses: the job fails naming the pod and the reason (permanent
refusals), or waits Pending with a Warning Event and backs off (quota) -- never a tight loop."""

from __future__ import annotations

import re
import time

from ft_helpers import wait_for
from podsecurity import restricted_namespace
from test_operator_create import elasticjob


def test_a_pod_refused_by_podsecurity_fails_the_job_naming_pod_and_reason(k8s_cluster, operator, jobs):
    k8s_cluster.admit(restricted_namespace(k8s_cluster.namespace))
    job = elasticjob("loose")
    job["spec"]["replicaSpecs"]["master"] = {
        "template": {"spec": {"containers": [{"securityContext": {"allowPrivilegeEscalation": True}}]}}}
    jobs.create(job)
    status = wait_for(lambda: jobs.status("loose").get("phase") == "Failed" and jobs.status("loose"),
                      timeout=30, what="the job to fail")
    assert status["message"] == (
        'cannot create pod "loose-master-0": the API server refused it (403 Forbidden): pods "loose-master-0" is '
        'forbidden: violates PodSecurity "restricted:latest": container \'master\': allowPrivilegeEscalation != false')
    (event,) = [e for e in jobs.events("loose") if e["reason"] == "MasterRefused"]
    assert event["type"] == "Warning" and "loose-master-0" in event["message"]
    assert jobs.master_pods("loose") == {}


def test_default_pods_are_admitted_by_a_restricted_namespace(k8s_cluster, operator, jobs):
    k8s_cluster.admit(restricted_namespace(k8s_cluster.namespace))
    jobs.create(elasticjob("strict"))
    wait_for(lambda: jobs.master_pods("strict"), timeout=30, what="the master pod")
    # The pod is created before the handler's status patch lands: wait for the phase, not a snapshot.
    phase = wait_for(lambda: jobs.status("strict").get("phase"), timeout=30, what="the job's phase")
    assert phase in ("Pending", "Running")
    assert not [e for e in jobs.events("strict") if e["reason"] == "MasterRefused"]


def test_quota_keeps_the_job_pending_with_backoff_until_it_frees(k8s_cluster, operator, jobs):
    tries: list = []
    lift = k8s_cluster.admit(lambda res, ns, body: (
        tries.append(time.monotonic()) or (403, "Forbidden", f'pods "{body["metadata"]["name"]}" is forbidden: '
                                                                 "exceeded quota: team-quota, requested: pods=1, "
                                                                 "used: pods=10, limited: pods=10"))
        if res == "v1/pods" else None)
    jobs.create(elasticjob("quota"))
    status = wait_for(lambda: "exceeded quota" in (jobs.status("quota").get("message") or "") and jobs.status("quota"),
                      timeout=30, what="a status naming the quota")
    assert status["phase"] == "Pending"
    assert status["message"].startswith('waiting for quota: pods "quota-master-0" is forbidden: exceeded quota: '
                                        'team-quota'), status["message"]
    assert re.search(r'\(to create pod "quota-master-0"; try \d, next in \d+s\)$', status["message"]), status["message"]
    start = tries[0]
    wait_for(lambda: time.monotonic() - start > 7, timeout=30, what="seven seconds")  # the sweep runs every second
    within = [t for t in tries if t - start <= 7]
    assert 2 <= len(within) <= 3, within  # tries at 0, 2, 6 s: backing off, not one per sweep
    gaps = [b - a for a, b in zip(within, within[1:])]
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:])), gaps
    warnings = [e for e in jobs.events("quota") if e["reason"] == "MasterPending"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"  # one Event per reason, not per try
    assert jobs.status("quota")["phase"] == "Pending" and "masterRelaunches" not in jobs.status("quota")
    lift()
    wait_for(lambda: jobs.master_pods("quota"), timeout=40, what="the master pod once the quota frees")
    status = wait_for(lambda: jobs.status("quota").get("masterRelaunches") == 0 and jobs.status("quota"),
                      timeout=30, what="the created status")
    assert status["message"] == "master pod quota-master-0 created"
    assert "MasterCreated" in jobs.reasons("quota")


def test_a_volume_typo_and_other_problems_fail_the_job_at_once_without_a_loop(k8s_cluster, operator, jobs):
    """The issue's case: `persistentVolumeClam` passed the CRD and the operator, and the pod create
    then failed every second forever. Now admission names it, with every other problem."""
    creates: list = []
    k8s_cluster.admit(lambda res, ns, body: creates.append((body["kind"], body["metadata"]["name"]))
                      if res in ("v1/pods", "v1/services") else None)
    job = elasticjob("typo", replicas=2, maxReplicas=1)
    job["spec"]["training"]["epochs"] = 0
    job["spec"]["volumes"] = [{"name": "data", "mountPath": "/data", "persistentVolumeClam": {"claimName": "d"}}]
    jobs.create(job)
    status = wait_for(lambda: jobs.status("typo").get("phase") == "Failed" and jobs.status("typo"),
                      timeout=30, what="the job to fail")
    lines = status["message"].splitlines()
    assert any(line.startswith("spec.volumes[0]: ") and "persistentVolumeClam" in line for line in lines), lines
    assert "spec.training.epochs: must be a positive integer, got 0" in lines
    assert any(line.startswith("spec.replicaSpecs.worker.") and "maxReplicas" in line for line in lines), lines
    (event,) = [e for e in jobs.events("typo") if e["reason"] == "InvalidSpec"]
    assert event["type"] == "Warning" and "persistentVolumeClam" in event["message"]
    # A Failed job is terminal: neither the create handler nor the sweep (every second here) tries
    # anything for it. A later job's creates, seen after the failure, are the only ones.
    jobs.create(elasticjob("after"))
    wait_for(lambda: jobs.master_pods("after"), timeout=30, what="the next job's master")
    wait_for(lambda: jobs.status("after").get("masterRelaunches") == 0, timeout=30, what="the next job's created status")
    assert jobs.master_pods("typo") == {} and jobs.service("typo") is None
    # (the sweep may have healed the later job's Service since: a create answered "exists", counted here)
    assert not [c for c in creates if c[1].startswith("typo")], creates
    assert creates[:2] == [("Service", "after-master"), ("Pod", "after-master-0")], creates


WEBHOOK = 'admission webhook "status-guard.example.com" denied the request: status writes are frozen'


def refuse_operator_status(cluster, name: str, tries: list | None = None):
    """A webhook refusing the status the operator writes for job ``name`` (not kopf's own patches)."""
    def check(res, ns, obj, sub, body):
        if sub == "status" and obj == name and "masterRelaunches" in (body.get("status") or {}):
            if tries is not None:
                tries.append(time.monotonic())
            return 403, "Forbidden", WEBHOOK
        return None
    return cluster.admit_patch(check)


def test_a_refused_status_is_one_warning_event_and_retried_with_backoff(k8s_cluster, operator, jobs):
    tries: list = []
    lift = refuse_operator_status(k8s_cluster, "guarded", tries)
    jobs.create(elasticjob("guarded"))
    wait_for(lambda: jobs.master_pods("guarded"), timeout=30, what="the master pod (its create was accepted)")
    (event,) = wait_for(lambda: [e for e in jobs.events("guarded") if e["reason"] == "StatusRefused"],
                        timeout=30, what="a StatusRefused event")
    assert event["type"] == "Warning"
    assert event["message"].startswith(
        f'cannot patch the status of ElasticJob "guarded": the API server refused it (403 Forbidden): {WEBHOOK} '
        "(try 1; the operator checks the job again in 2s)"), event["message"]
    assert "MasterCreated" in jobs.reasons("guarded")  # recorded before the status it could not write
    start = tries[0]
    wait_for(lambda: time.monotonic() - start > 7, timeout=30, what="seven seconds")  # the sweep runs every second
    within = [t for t in tries if t - start <= 7]
    assert 2 <= len(within) <= 3, within  # tries at 0, 2, 6 s: backing off, not one per sweep
    assert [e["reason"] for e in jobs.events("guarded")].count("StatusRefused") == 1  # one per reason
    assert "masterRelaunches" not in jobs.status("guarded")
    lift()
    status = wait_for(lambda: jobs.status("guarded").get("masterRelaunches") == 0 and jobs.status("guarded"),
                      timeout=40, what="the created status once the webhook lets it through")
    assert status["phase"] == "Pending" and status["message"] == "master pod guarded-master-0 created"
    assert list(jobs.master_pods("guarded")) == [0]  # the pod was not created twice


def test_a_failure_whose_status_is_refused_is_still_told_by_its_event(k8s_cluster, operator, jobs):
    refuse = k8s_cluster.admit_patch(lambda res, ns, obj, sub, body: (
        (403, "Forbidden", WEBHOOK) if sub == "status" and obj == "broken"
        and (body.get("status") or {}).get("phase") == "Failed" else None))
    jobs.create(elasticjob("broken", replicas=2, maxReplicas=1))
    wait_for(lambda: {"InvalidSpec", "StatusRefused"} <= set(jobs.reasons("broken")), timeout=30,
             what="the InvalidSpec and StatusRefused events")
    (invalid,) = [e for e in jobs.events("broken") if e["reason"] == "InvalidSpec"]
    assert invalid["type"] == "Warning" and "maxReplicas" in invalid["message"]
    refuse()
    wait_for(lambda: jobs.status("broken").get("phase") == "Failed", timeout=40, what="the Failed status, retried")
    assert jobs.master_pods("broken") == {}
    assert jobs.reasons("broken").count("InvalidSpec") == 1  # the retries did not repeat it
