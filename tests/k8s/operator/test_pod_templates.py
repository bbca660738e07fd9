"""Pod templates (spec.replicaSpecs.<role>.template): what a pod of each role carries, the defaults
that pass a PodSecurity ``restricted`` namespace, and the job's labels on every pod."""

from __future__ import annotations

import copy

import pytest
from podsecurity import restricted_violations
from test_master_pod import TLS_MOUNT

from flextrain.k8s import meta
from flextrain.k8s.master_pod import master_pod
from flextrain.k8s.pods import instance_pod

JOB = {
    "apiVersion": meta.API_VERSION, "kind": meta.KIND,
    "metadata": {"name": "digits", "namespace": "team-a", "uid": "u-1",
                 "labels": {"team": "vision", "cost-center": "42", f"{meta.GROUP}/job": "spoof"}},
    "spec": {"image": "registry.example/flextrain:1", "modelDef": "/zoo/m.py:Model",
             "data": {"training": "/data"},
             "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}, "mountPath": "/data"}],
             "replicaSpecs": {"worker": {"replicas": 2}, "ps": {"env": [{"name": "A", "value": "1"}]}}},
}
GPU_TEMPLATE = {
    "metadata": {"labels": {"team": "override", "pool": "gpu"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    "spec": {
        "nodeSelector": {"accelerator": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
        "schedulerName": "volcano", "priorityClassName": "high", "serviceAccountName": "trainer",
        "imagePullSecrets": [{"name": "regcred"}], "runtimeClassName": "nvidia",
        "securityContext": {"runAsUser": 2000, "fsGroup": 2000},
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        "containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        "envFrom": [{"secretRef": {"name": "wandb"}}], "env": [{"name": "B", "value": "2"}],
                        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                        "securityContext": {"readOnlyRootFilesystem": True}}],
    },
}


def with_template(role: str, template: dict) -> dict:
    job = copy.deepcopy(JOB)
    job["spec"]["replicaSpecs"].setdefault(role, {})["template"] = template
    return job


def worker(job: dict) -> dict:
    return instance_pod(job, role="worker", index=1, instance_id="worker-1", args=["worker"],
                        env={"FLEXTRAIN_X": "1"}, master_address="digits-master.team-a.svc:50051")


@pytest.mark.parametrize("role", ["master", "worker", "ps"])
def test_pods_without_a_template_pass_the_restricted_profile(role):
    pod = master_pod(JOB, index=0) if role == "master" else instance_pod(
        JOB, role=role, index=0, instance_id=f"{role}-0", args=[role], env={}, master_address="m:1")
    assert restricted_violations(pod) == []
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "readOnlyRootFilesystem": True}
    assert pod["spec"]["serviceAccountName"] == ("digits-master" if role == "master" else meta.JOB_SERVICE_ACCOUNT)


def test_a_worker_pod_carries_its_template_under_flextrains_own_fields():
    pod = worker(with_template("worker", GPU_TEMPLATE))
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "schedulerName",
                "priorityClassName", "serviceAccountName", "imagePullSecrets", "runtimeClassName"):
        assert spec[key] == GPU_TEMPLATE["spec"][key], key
    assert spec["restartPolicy"] == "Never"
    # Pod security: the template's entries over the restricted defaults, key by key.
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 2000, "runAsGroup": 10001,
                                       "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "readOnlyRootFilesystem": True}
    assert restricted_violations(pod) == []
    # Volumes: the job's and the template's, each mounted where it was asked for.
    assert [v["name"] for v in spec["volumes"]] == ["data", "shm", "flextrain-scratch", "flextrain-job-dir",
                                                    "flextrain-tls"]  # + hardening's, + spec.tls's Secret
    assert container["volumeMounts"][:2] == [{"name": "data", "mountPath": "/data"},
                                             {"name": "shm", "mountPath": "/dev/shm"}]
    assert container["volumeMounts"][-1] == TLS_MOUNT
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    names = [e["name"] for e in container["env"]]
    assert names[0] == "B" and meta.ENV_ROLE in names and "FLEXTRAIN_X" in names
    assert container["command"] == ["flextrain"] and container["args"] == ["worker"]
    assert container["image"] == "registry.example/flextrain:1"


def test_job_labels_reach_every_pod_and_flextrains_own_win():
    pod = worker(with_template("worker", GPU_TEMPLATE))
    labels = pod["metadata"]["labels"]
    assert labels["cost-center"] == "42"  # from the job
    assert labels["team"] == "override" and labels["pool"] == "gpu"  # the template wins over the job
    assert labels[meta.LABEL_JOB] == "digits" and labels[meta.LABEL_ROLE] == "worker"  # ours win over both
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    master = master_pod(JOB, index=0)
    assert master["metadata"]["labels"]["team"] == "vision" and master["metadata"]["labels"]["cost-center"] == "42"
    assert master["metadata"]["labels"][meta.LABEL_JOB] == "digits"


def test_a_template_applies_to_its_role_only():
    job = with_template("worker", GPU_TEMPLATE)
    master = master_pod(job, index=0)
    assert "nodeSelector" not in master["spec"] and master["spec"]["serviceAccountName"] == "digits-master"
    ps = instance_pod(job, role="ps", index=0, instance_id="ps-0", args=["ps"], env={}, master_address="m:1")
    assert "tolerations" not in ps["spec"]


def test_a_template_may_loosen_security_and_the_restricted_profile_then_says_why():
    loose = {"spec": {"containers": [{"securityContext": {"allowPrivilegeEscalation": True}}]}}
    pod = worker(with_template("worker", loose))
    assert restricted_violations(pod) == ["container 'worker': allowPrivilegeEscalation != false"]


# ---- what a template may not do: every problem, by path ------------------------------------------------
from flextrain.k8s.template import problems  # noqa: E402

BASE = "spec.replicaSpecs.worker.template"


@pytest.mark.parametrize("template, expected", [
    ({"spec": {"containers": [{"command": ["sh"]}]}}, f"{BASE}.spec.containers[0].command: is set by flextrain"),
    ({"spec": {"containers": [{"ports": [{"containerPort": 1}]}]}}, f"{BASE}.spec.containers[0].ports: is set by flextrain"),
    ({"spec": {"restartPolicy": "Always"}}, f"{BASE}.spec.restartPolicy: is set by flextrain"),
    ({"spec": {"hostNetwork": True}}, f"{BASE}.spec.hostNetwork: not supported in a flextrain pod template"),
    ({"spec": {"containers": [{"name": "sidecar"}]}}, f"{BASE}.spec.containers[0].name: must be 'worker'"),
    ({"spec": {"containers": [{}, {"name": "sidecar"}]}}, f"{BASE}.spec.containers: at most one container"),
    ({"spec": {"containers": [{"env": [{"name": "FLEXTRAIN_ROLE", "value": "ps"}]}]}},
     f"{BASE}.spec.containers[0].env[0].name: 'FLEXTRAIN_ROLE' is set by flextrain"),
    ({"metadata": {"labels": {f"{meta.GROUP}/role": "ps"}}}, f"{BASE}.metadata.labels.{meta.GROUP}/role: the "),
    ({"metadata": {"name": "x"}}, f"{BASE}.metadata.name: is set by flextrain"),
    ({"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}},
     f"{BASE}.spec.volumes[0].name: 'data' is also a volume of spec.volumes"),
    ({"spec": {"containers": [{"resources": {"limits": {"cpu": "1"}}}]}, "_shorthand": {"resources": {"a": 1}}},
     f"{BASE}.spec.containers[0].resources: also set by spec.replicaSpecs.worker.resources"),
    ({"spec": {"tolerations": [{"operator": "Exist", "effect": 3}]}}, f"{BASE}.spec.tolerations[0].effect: 3 is not"),
    ({"spec": {"nodeSelector": "gpu"}}, f"{BASE}.spec.nodeSelector: 'gpu' is not of type 'object'"),
], ids=["command", "ports", "restartPolicy", "hostNetwork", "sidecar-name", "two-containers", "identity-env",
        "our-label", "pod-name", "volume-name-clash", "shorthand-and-template", "schema-type", "schema-object"])
def test_a_template_that_touches_flextrains_fields_or_breaks_the_schema_is_refused_by_path(template, expected):
    job = copy.deepcopy(JOB)
    shorthand = template.pop("_shorthand", {})
    job["spec"]["replicaSpecs"]["worker"].update(shorthand, template=template)
    found = problems(job["spec"], "worker")
    assert any(p.startswith(expected) for p in found), found


def test_an_identity_variable_in_the_env_shorthand_is_refused_not_dropped():
    job = copy.deepcopy(JOB)
    job["spec"]["replicaSpecs"]["ps"]["env"].append({"name": "FLEXTRAIN_MASTER_ADDR", "value": "evil:1"})
    assert problems(job["spec"], "ps") == [
        "spec.replicaSpecs.ps.env[1].name: 'FLEXTRAIN_MASTER_ADDR' is set by flextrain (the pod's identity); "
        "use another name"]


def test_the_gpu_template_has_no_problems():
    assert problems(with_template("worker", GPU_TEMPLATE)["spec"], "worker") == []


def test_the_gpu_example_places_workers_only_and_passes_restricted():
    import yaml
    from ft_helpers import REPO

    job = yaml.safe_load((REPO / "manifests" / "examples" / "digits-gpu.yaml").read_text())
    job["metadata"].update(namespace="default", uid="u-2")
    assert problems(job["spec"], "worker") == []
    pod = worker(job)
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["metadata"]["labels"]["cost-center"] == "4711" and pod["metadata"]["labels"]["pool"] == "gpu"
    master = master_pod(job, index=0)
    assert "nodeSelector" not in master["spec"] and master["metadata"]["labels"]["team"] == "vision"
    assert restricted_violations(pod) == [] and restricted_violations(master) == []
