"""Every field of the ElasticJob spec does something, or is refused: none is silently ignored.

Walks the CRD's spec schema: each leaf is a JobSpec setting (``k8s/resource.py`` FIELDS, the CRD
column of ``flextrain.job.SETTINGS``), shapes the job's pods (POD_LEVEL), or is refused by the operator
with a message naming it when set (a field the CRD declares before flextrain acts on it); CONTROL fields
(``suspend``) steer a running job through the operator's relay.
"""

from __future__ import annotations

import copy

import pytest
from k8s_static_support import CRD_PATH, EXAMPLES, crd_schema, load_docs

from flextrain.k8s import resource
from flextrain.k8s.resource import ResourceError, jobspec_from_resource


def spec_leaves(node: dict, prefix: str = "") -> dict[str, dict]:
    """``{dotted path below spec: schema}`` of every field that holds a value (not declared sub-fields)."""
    out = {}
    for name, child in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        if "properties" in child and not child.get("x-kubernetes-preserve-unknown-fields"):
            out.update(spec_leaves(child, f"{path}."))
        else:
            out[path] = child
    return out


LEAVES = spec_leaves(crd_schema(load_docs(CRD_PATH)[0])["properties"]["spec"])
ACTIVE = {f.path for f in resource.FIELDS}
INACTIVE = set(resource.NOT_YET)


def pod_level(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in resource.POD_LEVEL)


def sample(schema: dict):
    if "enum" in schema:
        return schema["enum"][0]
    return {"string": "x", "integer": 2, "number": 0.5, "boolean": True, "array": [], "object": {}}[schema["type"]]


def test_the_walk_sees_the_spec():
    assert {"modelDef", "training.globalBatchSize", "replicaSpecs.worker.replicas", "image", "volumes"} <= set(LEAVES)


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_every_spec_field_has_behaviour_or_is_refused(path):
    assert path in ACTIVE or pod_level(path) or path in INACTIVE or path in resource.CONTROL, (
        f"spec.{path} is in the CRD but neither a JobSpec setting (flextrain/job/settings.py SETTINGS), pod-level "
        "(POD_LEVEL), relayed to the master (CONTROL) nor refused (NOT_YET): the operator would ignore it")
    if path in INACTIVE:
        job = copy.deepcopy(load_docs(EXAMPLES / "digits-allreduce.yaml")[0])
        head, _, leaf = path.rpartition(".")
        node = job["spec"]
        for part in head.split(".") if head else ():
            node = node.setdefault(part, {})
        node[leaf] = sample(LEAVES[path])
        with pytest.raises(ResourceError, match="is not supported yet") as info:
            jobspec_from_resource(job)
        assert info.value.path == f"spec.{path}"
