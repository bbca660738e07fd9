"""Bad ElasticJob specs are refused by the operator's own check, before anything is launched,
with a message that starts with the CRD field to fix (what ``kubectl describe ej/NAME`` shows).

The CRD's schema rejects most of these at the API server already (tests/k8s_static); this is the
operator's second line, which also catches what a schema cannot say (0 as a timeout, a bound
blaming the right field) and an API server that validates less than ours.
"""

from __future__ import annotations

import copy

import pytest

from flextrain.k8s.resource import ResourceError, jobspec_from_resource

GOOD = {
    "apiVersion": "flextrain.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "digits"},
    "spec": {"image": "flextrain:0.1.0", "modelDef": "/zoo/digits_torch.py:Model",
             "data": {"training": "/data/train"}, "replicaSpecs": {"worker": {"replicas": 2}}},
}


def with_field(dotted: str, value) -> dict:
    job = copy.deepcopy(GOOD)
    node = job
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return job


def test_the_good_spec_maps():
    spec = jobspec_from_resource(GOOD)
    assert spec.worker.replicas == 2 and spec.training.nan_policy == "fail" and spec.training.preflight is True


@pytest.mark.parametrize("field,value,expected", [
    ("spec.training.nanPolicy", "ignore", "spec.training.nanPolicy"),
    ("spec.training.preflight", "yes", "spec.training.preflight"),
    ("spec.replicaSpecs.worker.workerTimeout", 0, "spec.replicaSpecs.worker.workerTimeout"),
    ("spec.replicaSpecs.worker.rendezvousTimeout", -5, "spec.replicaSpecs.worker.rendezvousTimeout"),
    ("spec.replicaSpecs.worker.minWorkersTimeout", -1, "spec.replicaSpecs.worker.minWorkersTimeout"),
    ("spec.replicaSpecs.worker.relaunchBudget", -1, "spec.replicaSpecs.worker.relaunchBudget"),
    ("spec.replicaSpecs.worker.maxReplicas", 1, "spec.replicaSpecs.worker"),
    ("spec.training.learningRate", float("inf"), "spec.training.learningRate"),
    ("spec.training.learningRate", float("nan"), "spec.training.learningRate"),
    ("spec.training.seed", -3, "spec.training.seed"),
])
def test_a_bad_value_is_refused_naming_its_field(field, value, expected):
    with pytest.raises(ResourceError) as caught:
        jobspec_from_resource(with_field(field, value))
    assert str(caught.value).startswith(expected), str(caught.value)


# What a real API server refuses only when the pod or Service made from the spec is created (a worker
# pod refused mid-run fails the job): found at admission, by path, value and what is allowed.
_GPU_TEMPLATE = {"spec": {"tolerations": [{"key": "a", "operator": "Equals", "effect": "NoSchedul"}]}}


@pytest.mark.parametrize("field,value,expected", [
    ("metadata.name", "1digits", "metadata.name: '1digits' must start with a letter: the job's Service "
                                 "'1digits-master' must be a DNS-1035 label"),
    ("metadata.labels", {"team": "a b!"}, "metadata.labels.team: 'a b!' is not a valid label value"),
    ("spec.replicaSpecs.worker.resources", {"limits": {"memory": "-2Gi"}},
     "spec.replicaSpecs.worker.resources.limits.memory: '-2Gi' must be at least 0"),
    ("spec.replicaSpecs.worker.resources", {"limits": {"memory": "2Gi"}, "requests": {"memory": "4Gi"}},
     "spec.replicaSpecs.worker.resources.requests.memory: '4Gi' must be at most limits.memory ('2Gi')"),
    ("spec.replicaSpecs.worker.resources", {"limits": {"nvidia.com/gpu": "0.5"}},
     "spec.replicaSpecs.worker.resources.limits.nvidia.com/gpu: '0.5' must be a whole number"),
    ("spec.replicaSpecs.worker.resources", {"limits": {"nvidia/gpu!": 1}},
     "spec.replicaSpecs.worker.resources.limits.nvidia/gpu!: 'nvidia/gpu!' is not a valid resource name"),
    ("spec.replicaSpecs.master.resources", {"limits": {"memory": "2GB"}},
     "spec.replicaSpecs.master.resources.limits.memory: '2GB' is not a Kubernetes quantity: a number with an "
     "optional suffix"),
    ("spec.replicaSpecs.worker.env", [{"name": "X", "valueFrom": {"secretKeyRf": {"name": "a", "key": "b"}}}],
     "spec.replicaSpecs.worker.env[0].valueFrom: unknown field ('secretKeyRf' was unexpected)"),
    ("spec.replicaSpecs.worker.env", [{"name": "X", "value": "a", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
     "spec.replicaSpecs.worker.env[0]: has both value and valueFrom; set one"),
    ("spec.replicaSpecs.ps.env", [{"name": "BAD NAME", "value": "x"}],
     "spec.replicaSpecs.ps.env[0].name: 'BAD NAME' is not a valid environment variable name"),
    ("spec.volumes", [{"name": "Data_Vol", "mountPath": "/data", "emptyDir": {}}],
     "spec.volumes[0].name: 'Data_Vol' is not a valid volume name: a DNS label"),
    ("spec.volumes", [{"name": "data", "mountPath": "/data", "emptyDir": {}}] * 2,
     "spec.volumes[1].name: 'data' is also the name of spec.volumes[0]; volume names must be unique"),
    ("spec.volumes", [{"name": "a", "mountPath": "/data", "emptyDir": {}}, {"name": "b", "mountPath": "/data/"}],
     "spec.volumes[1].mountPath: '/data/' is also the mountPath of spec.volumes[0]; one volume per path"),
    ("spec.volumes", [{"name": "data", "mountPath": "/data", "emptyDir": {},
                       "persistentVolumeClaim": {"claimName": "c"}}],
     "spec.volumes[0]: has 2 volume sources (emptyDir, persistentVolumeClaim); a volume has one"),
    ("spec.replicaSpecs.worker.template", {"spec": {"containers": [{"volumeMounts": [{"name": "nope",
                                                                                      "mountPath": "/x"}]}]}},
     "spec.replicaSpecs.worker.template.spec.containers[0].volumeMounts[0].name: no volume named 'nope' in the pod"),
    ("spec.replicaSpecs.worker.template", {"metadata": {"labels": {"team": "a b!"}}},
     "spec.replicaSpecs.worker.template.metadata.labels.team: 'a b!' is not a valid label value"),
    ("spec.replicaSpecs.worker.template", _GPU_TEMPLATE,
     "spec.replicaSpecs.worker.template.spec.tolerations[0].operator: must be Equal or Exists, got 'Equals'"),
    ("spec.replicaSpecs.worker.template", _GPU_TEMPLATE,
     "spec.replicaSpecs.worker.template.spec.tolerations[0].effect: must be NoSchedule, PreferNoSchedule, "
     "NoExecute or empty"),
    ("spec.replicaSpecs.worker.memoryLadder", ["4 Gi", "big"],
     "spec.replicaSpecs.worker.memoryLadder[0]: '4 Gi' is not a Kubernetes quantity"),
    ("spec.replicaSpecs.worker.memoryLadder", ["8Gi", "4Gi"],
     "spec.replicaSpecs.worker.memoryLadder[1]: '4Gi' must be larger than the size before it ('8Gi')"),
    ("spec.jobDir", "jobs/digits", "spec.jobDir: must be an absolute path inside the pods"),
    ("spec.metricsPort", 50051, "spec.metricsPort: 50051 is the master's gRPC port"),
    ("spec.replicaSpecs.master.priorityClassName", "UPPER",
     "spec.replicaSpecs.master.priorityClassName: must be a Kubernetes object name"),
    ("spec.replicaSpecs.ps.priorityClassName", "Bad_PS!",
     "spec.replicaSpecs.ps.priorityClassName: must be a Kubernetes object name"),
    ("spec.replicaSpecs.worker.template", {"spec": {"priorityClassName": "Bad_Tmpl!"}},
     "spec.replicaSpecs.worker.template.spec.priorityClassName: must be a Kubernetes object name"),
])
def test_what_the_api_server_would_refuse_later_is_refused_at_admission(field, value, expected):
    with pytest.raises(ResourceError) as caught:
        jobspec_from_resource(with_field(field, value))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_valid_pod_fields_pass_the_api_server_checks():
    job = copy.deepcopy(GOOD)
    job["metadata"]["labels"] = {"app.kubernetes.io/part-of": "nlp", "empty": ""}
    job["spec"].update(jobDir="/data/jobs/digits", metricsPort=9000, volumes=[
        {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "c"}, "readOnly": True}])
    worker = job["spec"]["replicaSpecs"]["worker"]
    worker.update(memoryLadder=["4Gi", "8Gi", 17179869184], env=[
        {"name": "A.b-c", "value": ""}, {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
    worker["template"] = {"metadata": {"labels": {"team": "nlp"}}, "spec": {
        "nodeSelector": {"nvidia.com/gpu.present": "true"}, "priorityClassName": "high.priority",
        "tolerations": [{"operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 5}],
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "containers": [{"resources": {"limits": {"cpu": 2, "memory": "2Gi", "nvidia.com/gpu": 1},
                                      "requests": {"cpu": "500m", "memory": "1.5Gi", "nvidia.com/gpu": "1"}},
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}]}}
    job["spec"]["replicaSpecs"]["master"] = {"priorityClassName": "p1", "resources": {"limits": {"memory": "1e9"}}}
    assert jobspec_from_resource(job).worker.replicas == 2
