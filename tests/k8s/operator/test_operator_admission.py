"""A job with spec.suspend or a gang waits Pending, saying why, and starts once admitted.

Kueue and Volcano cannot run here: their admission is emulated as they perform it (Kueue sets
spec.suspend to false; Volcano writes the PodGroup's status.phase Inqueue).
"""

from __future__ import annotations

from ft_helpers import wait_for
from test_operator_create import elasticjob

from flextrain.k8s import gang, meta
from flextrain.k8s.pods import instance_pod


def set_pod_group_phase(jobs, name: str, phase: str) -> None:
    jobs.kube.custom.patch_namespaced_custom_object_status(
        gang.PODGROUP_GROUP, gang.PODGROUP_VERSION, jobs.namespace, gang.PODGROUP_PLURAL, name,
        {"status": {"phase": phase}})


def pod_group(jobs, name: str) -> dict:
    return jobs.kube.custom.get_namespaced_custom_object(
        gang.PODGROUP_GROUP, gang.PODGROUP_VERSION, jobs.namespace, gang.PODGROUP_PLURAL, name)


def admitted(jobs, name: str) -> dict:
    return {c["type"]: c for c in jobs.status(name).get("conditions") or ()}.get("Admitted") or {}


def test_kueue_job_waits_suspended_until_admitted_then_starts(operator, jobs):
    body = elasticjob("queued")
    body["metadata"]["labels"] = {gang.KUEUE_QUEUE_LABEL: "team-a"}
    body["spec"].update(suspend=True, scheduling={"gang": "kueue", "queue": "team-a"})
    jobs.create(body)
    status = wait_for(lambda: jobs.status("queued").get("phase") == "Pending" and jobs.status("queued"),
                      timeout=30, what="the suspended job Pending")
    assert status["message"].startswith("waiting for admission: suspended until Kueue admits it (LocalQueue team-a")
    assert admitted(jobs, "queued")["status"] == "False" and admitted(jobs, "queued")["reason"] == "Suspended"
    assert jobs.master_pods("queued") == {} and jobs.service("queued") is None
    assert "masterRelaunches" not in status and "startTime" not in status  # the deadline does not run yet

    jobs.patch("queued", {"spec": {"suspend": False}})  # what Kueue does when it admits the job
    wait_for(lambda: 0 in jobs.master_pods("queued"), timeout=30, what="the master once admitted")
    status = wait_for(lambda: (s := jobs.status("queued")).get("masterRelaunches") == 0 and s, timeout=30,
                      what="the job marked created")
    assert status["message"] == "master pod queued-master-0 created" and status["startTime"]
    assert admitted(jobs, "queued")["status"] == "True"
    assert jobs.reasons("queued").count("WaitingForAdmission") == 1  # the sweep repeats the check, not the Event


def test_plain_suspended_job_says_so(operator, jobs):
    body = elasticjob("later")
    body["spec"]["suspend"] = True
    jobs.create(body)
    status = wait_for(lambda: jobs.status("later").get("message") and jobs.status("later"), timeout=30,
                      what="the suspended job's status")
    assert status["phase"] == "Pending" and status["message"].startswith("suspended (spec.suspend: true)")
    assert jobs.master_pods("later") == {}


def test_volcano_job_gets_a_pod_group_and_waits_until_it_is_inqueue(operator, jobs):
    body = elasticjob("gang")  # replicas 2, minReplicas 1
    body["spec"]["strategy"] = "ParameterServer"
    body["spec"]["replicaSpecs"]["ps"] = {"replicas": 2}
    body["spec"]["scheduling"] = {"gang": "volcano", "queue": "research"}
    job = jobs.create(body)
    group = wait_for(lambda: jobs.status("gang").get("phase") == "Pending" and pod_group(jobs, "gang"),
                     timeout=30, what="the PodGroup and a Pending job")
    assert group["spec"] == {"minMember": 3, "queue": "research"}  # 2 PS + minReplicas 1
    assert group["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert "PodGroup gang is Pending (Volcano, queue research; minMember 3" in jobs.status("gang")["message"]
    assert jobs.master_pods("gang") == {}

    set_pod_group_phase(jobs, "gang", "Inqueue")  # Volcano admitted the gang
    pods = wait_for(lambda: jobs.master_pods("gang"), timeout=30, what="the master once the PodGroup is Inqueue")
    master = pods[0]
    # Created alone before its group's members exist, the master is not one (Volcano would hold it for ever).
    assert "schedulerName" not in master["spec"]
    assert gang.VOLCANO_GROUP_ANNOTATION not in (master["metadata"].get("annotations") or {})
    for role, index in (("worker", 0), ("ps", 1)):  # what the master creates: members of the gang
        pod = instance_pod(jobs.get("gang"), role=role, index=index, instance_id=f"{role}-{index}", args=(), env={},
                           master_address="gang-master:50051")
        assert pod["spec"]["schedulerName"] == "volcano", role
        assert pod["metadata"]["annotations"][gang.VOLCANO_GROUP_ANNOTATION] == "gang"
        assert pod["metadata"]["labels"][meta.LABEL_JOB] == "gang"


def test_the_operators_default_gang_applies_to_jobs_without_their_own(k8s_api, k8s_cluster, jobs):
    from operator_support import Operator

    op = Operator(k8s_api, k8s_cluster.namespace, sweep_interval=1.0,
                  default_scheduling={"gang": "kueue", "queue": "shared"}).start()  # the chart's scheduling value
    try:
        jobs.create(elasticjob("plain"))
        status = wait_for(lambda: jobs.status("plain").get("phase") == "Pending" and jobs.status("plain"),
                          timeout=30, what="the job held for admission")
        job = jobs.get("plain")
        assert job["spec"]["scheduling"] == {"gang": "kueue", "queue": "shared"} and job["spec"]["suspend"] is True
        assert job["metadata"]["labels"][gang.KUEUE_QUEUE_LABEL] == "shared"
        assert "LocalQueue shared" in status["message"] and jobs.master_pods("plain") == {}
    finally:
        op.close()
