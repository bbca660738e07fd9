"""Worker/PS Pods and PS Services built from an InstanceSpec and the ElasticJob."""

from __future__ import annotations

import kubernetes_validate
import pytest

from flextrain.k8s import meta
from flextrain.k8s.pods import instance_pod, ps_service, service_address

K8S_VERSION = "1.30.0"


def job() -> dict:
    spec = {
        "image": "flextrain:test", "imagePullPolicy": "IfNotPresent",
        "modelDef": "/zoo/digits_torch.py:Model", "data": {"training": "/data/train"},
        "replicaSpecs": {
            "worker": {"replicas": 2, "resources": {"limits": {"memory": "4Gi"}}, "priorityClassName": "low",
                       "env": [{"name": "LOG", "value": "1"}, {"name": meta.ENV_INSTANCE_ID, "value": "x"}]},
            "ps": {"replicas": 1, "resources": {"requests": {"cpu": "2"}}},
        },
        "volumes": [{"name": "data", "mountPath": "/data", "readOnly": True,
                     "persistentVolumeClaim": {"claimName": "pvc"}}],
    }
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND,
            "metadata": {"name": "digits", "namespace": "team-a", "uid": "1234-uid"}, "spec": spec}


def worker(**kw) -> dict:
    return instance_pod(job(), role="worker", index=3, instance_id="worker-3",
                        args=("worker", "--master", "10.0.0.7:50051", "--worker-id", "worker-3"),
                        env={"FLEXTRAIN_NUM_THREADS": "2"}, master_address="10.0.0.7:50051", **kw)


def test_worker_pod_carries_identity_settings_and_owner():
    pod = worker()
    md, spec = pod["metadata"], pod["spec"]
    c = spec["containers"][0]
    assert md["name"] == "digits-worker-3" and md["namespace"] == "team-a"
    assert md["labels"][meta.LABEL_INDEX] == "3" and md["labels"][meta.LABEL_ROLE] == "worker"
    assert md["ownerReferences"][0]["uid"] == "1234-uid" and md["ownerReferences"][0]["controller"] is True
    assert spec["restartPolicy"] == "Never" and spec["serviceAccountName"] == meta.JOB_SERVICE_ACCOUNT
    assert spec["priorityClassName"] == "low"
    # the job's volume first (then hardening's scratch and job directory, and spec.tls's Secret)
    assert spec["volumes"][0] == {"name": "data", "persistentVolumeClaim": {"claimName": "pvc"}}
    assert c["volumeMounts"][0] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert spec["volumes"][-1] == {"name": "flextrain-tls", "secret": {"secretName": "digits-tls", "defaultMode": 0o444}}
    assert c["volumeMounts"][-1] == {"name": "flextrain-tls", "mountPath": "/var/run/secrets/flextrain.dev/tls",
                                     "readOnly": True}
    assert c["resources"] == {"limits": {"memory": "4Gi"}} and c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["flextrain"] and c["args"][0] == "worker"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env[meta.ENV_INSTANCE_ID] == "worker-3"  # the user's env cannot rename the instance
    assert [e["name"] for e in c["env"]].count(meta.ENV_INSTANCE_ID) == 1
    assert env["LOG"] == "1" and env["FLEXTRAIN_NUM_THREADS"] == "2"
    assert env[meta.ENV_MASTER_ADDR] == "10.0.0.7:50051"


def test_ps_pod_uses_the_ps_settings_and_exposes_its_port():
    pod = instance_pod(job(), role="ps", index=0, instance_id="ps-0", args=("ps",), env={},
                       master_address="m:1")
    c = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "digits-ps-0"
    assert c["resources"] == {"requests": {"cpu": "2"}} and "priorityClassName" not in pod["spec"]
    assert c["ports"] == [{"name": "grpc", "containerPort": meta.PS_PORT, "protocol": "TCP"}]


@pytest.mark.parametrize("build", [lambda: worker(), lambda: ps_service(job(), index=1)])
def test_objects_validate_strictly_against_the_kubernetes_schema(build):
    kubernetes_validate.validate(build(), K8S_VERSION, strict=True)


def test_service_address_prefers_the_cluster_ip():
    svc = ps_service(job(), index=1)
    assert svc["metadata"]["name"] == "digits-ps-1"
    assert service_address({**svc, "spec": {**svc["spec"], "clusterIP": "10.1.2.3"}},
                           default_port=1) == f"10.1.2.3:{meta.PS_PORT}"
    headless = {**svc, "spec": {**svc["spec"], "clusterIP": "None"}}
    assert service_address(headless, default_port=1) == f"digits-ps-1.team-a.svc:{meta.PS_PORT}"
