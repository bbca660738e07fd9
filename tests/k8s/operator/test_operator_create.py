"""ElasticJob created -> the operator validates it and creates the master Service and Pod."""

from __future__ import annotations

from ft_helpers import wait_for

from flextrain.k8s import meta


def elasticjob(name: str = "digits", **worker) -> dict:
    return {
        "apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": name},
        "spec": {
            "image": "flextrain:test", "modelDef": "/zoo/digits_torch.py:Model",
            "data": {"training": "/data/train"}, "training": {"epochs": 1},
            "replicaSpecs": {"worker": {"replicas": 2, "minReplicas": 1, "maxReplicas": 3, **worker}},
        },
    }


def test_create_makes_master_pod_and_service_owned_by_the_job(operator, jobs):
    job = jobs.create(elasticjob())
    uid = job["metadata"]["uid"]
    pods = wait_for(lambda: jobs.master_pods("digits"), timeout=30, what="the master pod")
    assert list(pods) == [0]
    pod = pods[0]
    assert pod["metadata"]["name"] == "digits-master-0"
    assert pod["spec"]["containers"][0]["args"][:5] == ["master", "--job", "digits", "--namespace", "default"]
    svc = wait_for(lambda: jobs.service("digits"), timeout=30, what="the master service")
    for made in (pod, svc):
        ref, = made["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("ElasticJob", "digits", uid, True)
    status = wait_for(lambda: jobs.status("digits").get("phase") and jobs.status("digits"),
                      timeout=30, what="the initial status")
    assert status["phase"] == "Pending" and status["masterRelaunches"] == 0
    assert status["selector"] == "flextrain.dev/job=digits,flextrain.dev/role=worker"
    assert status["workers"] == {"desired": 2, "active": 0, "summary": "0/2"}
    wait_for(lambda: "MasterCreated" in jobs.reasons("digits"), timeout=30, what="a MasterCreated event")
    # No finalizer: deleting a job never waits for the operator.
    assert not jobs.get("digits")["metadata"].get("finalizers")


def test_invalid_spec_fails_with_the_field_named_and_a_warning_event(operator, jobs):
    jobs.create(elasticjob("bad", minReplicas=5, replicas=3))
    status = wait_for(lambda: jobs.status("bad").get("phase") == "Failed" and jobs.status("bad"),
                      timeout=30, what="the job to fail")
    assert status["message"] == "spec.replicaSpecs.worker.minReplicas (5) > replicas (3)"
    event = wait_for(lambda: [e for e in jobs.events("bad") if e["reason"] == "InvalidSpec"],
                     timeout=30, what="an InvalidSpec event")[0]
    assert event["type"] == "Warning" and "minReplicas (5) > replicas (3)" in event["message"]
    assert event["involvedObject"]["name"] == "bad" and event["involvedObject"]["kind"] == "ElasticJob"
    assert jobs.master_pods("bad") == {} and jobs.service("bad") is None  # nothing was started
