"""The master Pod and Service: owned by the job, labelled, and valid core/v1 objects."""

from __future__ import annotations

import kubernetes_validate
import pytest

from flextrain.k8s import meta
from flextrain.k8s.master_pod import master_pod, master_port, master_service

K8S_VERSION = "1.30.0"


def job(annotations=None, **spec) -> dict:
    body = {
        "image": "flextrain:test", "imagePullPolicy": "IfNotPresent",
        "modelDef": "/zoo/digits_torch.py:Model", "data": {"training": "/data/train"},
        "replicaSpecs": {
            "master": {"resources": {"requests": {"cpu": "250m"}}, "priorityClassName": "high",
                       "env": [{"name": "LOG", "value": "1"}, {"name": meta.ENV_ROLE, "value": "worker"}]},
            "worker": {"replicas": 2},
        },
        "volumes": [{"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "pvc"}}],
        **spec,
    }
    md = {"name": "digits", "namespace": "team-a", "uid": "1234-uid"}
    if annotations:
        md["annotations"] = annotations
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": md, "spec": body}


TLS_MOUNT = {"name": "flextrain-tls", "mountPath": "/var/run/secrets/flextrain.dev/tls", "readOnly": True}


def tls_volume(job: str = "digits") -> dict:
    return {"name": "flextrain-tls", "secret": {"secretName": f"{job}-tls", "defaultMode": 0o444}}


def env_of(pod) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_master_pod_runs_flextrain_master_for_its_job():
    pod = master_pod(job(), index=2)
    c = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "digits-master-2"
    assert c["command"] == ["flextrain"]
    assert c["args"] == ["master", "--job", "digits", "--namespace", "team-a", "--port", "50051"]
    assert c["image"] == "flextrain:test" and c["imagePullPolicy"] == "IfNotPresent"
    assert pod["spec"]["restartPolicy"] == "Never"  # the operator relaunches, counting a budget
    assert pod["spec"]["serviceAccountName"] == "digits-master"  # its job's own (flextrain.k8s.access)
    assert pod["spec"]["priorityClassName"] == "high"
    assert c["resources"] == {"requests": {"cpu": "250m"}}
    # the job's volume, the read-only root filesystem's scratch and job directory (flextrain.k8s.hardening),
    # then the job's TLS Secret (spec.tls, on by default: flextrain/k8s/tls_secret.py)
    assert c["volumeMounts"] == [{"name": "data", "mountPath": "/data"},
                                 {"name": "flextrain-scratch", "mountPath": "/tmp"},
                                 {"name": "flextrain-job-dir", "mountPath": "/flextrain-jobs/digits"}, TLS_MOUNT]
    assert pod["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "pvc"}},
                                      {"name": "flextrain-scratch", "emptyDir": {}},
                                      {"name": "flextrain-job-dir", "emptyDir": {}}, tls_volume()]


def test_master_pod_identity_env_cannot_be_overridden():
    env = env_of(master_pod(job(), index=0))
    assert env[meta.ENV_ROLE] == "master"  # the user's FLEXTRAIN_ROLE=worker was dropped
    assert env["LOG"] == "1"
    assert env[meta.ENV_JOB_NAME] == "digits" and env[meta.ENV_NAMESPACE] == "team-a"
    assert env[meta.ENV_INSTANCE_ID] == "digits-master-0"
    assert env[meta.ENV_MASTER_ADDR] == "digits-master.team-a.svc:50051"
    assert env[meta.ENV_POD_IP] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_owner_references_and_labels():
    obj = job()
    for made in (master_pod(obj, index=0), master_service(obj)):
        ref, = made["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "flextrain.dev/v1alpha1", "kind": "ElasticJob", "name": "digits",
                       "uid": "1234-uid", "controller": True, "blockOwnerDeletion": True}
        assert made["metadata"]["labels"][meta.LABEL_JOB] == "digits"
        assert made["metadata"]["labels"][meta.LABEL_ROLE] == "master"
    pod, svc = master_pod(obj, index=1), master_service(obj)
    # The Service selects every master pod of the job, whichever relaunch runs now.
    assert all(pod["metadata"]["labels"][k] == v for k, v in svc["spec"]["selector"].items())
    assert pod["metadata"]["labels"][meta.LABEL_INDEX] == "1"
    assert svc["metadata"]["name"] == "digits-master"


def test_master_port_annotation():
    obj = job(annotations={meta.ANNOTATION_MASTER_PORT: "41234"})
    assert master_port(obj) == 41234
    assert master_service(obj)["spec"]["ports"][0]["port"] == 41234
    assert master_pod(obj, index=0)["spec"]["containers"][0]["args"][-1] == "41234"
    with pytest.raises(ValueError, match="master-port.*not a port number: 'http'"):
        master_port(job(annotations={meta.ANNOTATION_MASTER_PORT: "http"}))


@pytest.mark.parametrize("build", [lambda j: master_pod(j, index=0), master_service])
def test_objects_validate_strictly_against_the_kubernetes_schema(build):
    kubernetes_validate.validate(build(job()), K8S_VERSION, strict=True)


def test_the_metrics_port_is_named_on_pod_and_service_with_scrape_annotations():
    pod, svc = master_pod(job(), index=0), master_service(job())
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in pod["spec"]["containers"][0]["ports"]
    assert {"name": "metrics", "port": 9464, "targetPort": 9464, "protocol": "TCP"} in svc["spec"]["ports"]
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9464",
                                              "prometheus.io/path": "/metrics"}
    assert "prometheus.io/scrape" not in (pod["metadata"].get("annotations") or {})  # scraped once, via the Service
    other = master_service(job(metricsPort=9100))
    assert other["spec"]["ports"][1]["port"] == 9100 and other["metadata"]["annotations"]["prometheus.io/port"] == "9100"
    off_pod, off_svc = master_pod(job(metrics=False), index=0), master_service(job(metrics=False))
    assert [p["name"] for p in off_svc["spec"]["ports"]] == ["grpc"] and "annotations" not in off_svc["metadata"]
    assert [p["name"] for p in off_pod["spec"]["containers"][0]["ports"]] == ["grpc"]
