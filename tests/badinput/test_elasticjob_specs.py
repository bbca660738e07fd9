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
