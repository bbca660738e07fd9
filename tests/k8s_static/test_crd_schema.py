"""The ElasticJob CRD: a valid, structural apiextensions/v1 object whose names match the rest of flextrain."""

from __future__ import annotations

import dataclasses
import re

import kubernetes_validate
import pytest
from k8s_static_support import (
    CHART_DIR,
    CRD_PATH,
    crd_schema,
    kube_versions,
    load_docs,
    resolve,
    schema_nodes,
)

from flextrain.job import JobSpec, Strategy
from flextrain.k8s import meta

# Where each JobSpec field lives in an ElasticJob. A field added to JobSpec must be added here and to
# manifests/crd.yaml (or to NOT_IN_CRD with the reason): one name per idea across CLI, CRD and JobSpec.
FIELD_PATHS = {
    "name": "metadata.name",
    "model_def": "spec.modelDef",
    "job_dir": "spec.jobDir",
    "training_data": "spec.data.training",
    "validation_data": "spec.data.validation",
    "prediction_data": "spec.data.prediction",
    "skip_unknown_files": "spec.data.skipUnknownFiles",
    "csv_header": "spec.data.csvHeader",
    "strategy": "spec.strategy",
    "workers": "spec.replicaSpecs.worker.replicas",
    "min_workers": "spec.replicaSpecs.worker.minReplicas",
    "max_workers": "spec.replicaSpecs.worker.maxReplicas",
    "relaunch_budget": "spec.replicaSpecs.worker.relaunchBudget",
    "rendezvous_timeout": "spec.replicaSpecs.worker.rendezvousTimeout",
    "worker_timeout": "spec.replicaSpecs.worker.workerTimeout",
    "start_timeout": "spec.replicaSpecs.worker.startTimeout",
    "min_workers_timeout": "spec.replicaSpecs.worker.minWorkersTimeout",
    "epochs": "spec.training.epochs",
    "global_batch_size": "spec.training.globalBatchSize",
    "max_micro_batch": "spec.training.maxMicroBatch",
    "learning_rate": "spec.training.learningRate",
    "lr_rule": "spec.training.lrRule",
    "batch_schedule": "spec.training.batchSchedule",
    "evaluation_steps": "spec.training.evaluationSteps",
    "checkpoint_dir": "spec.training.checkpointDir",
    "checkpoint_steps": "spec.training.checkpointSteps",
    "seed": "spec.training.seed",
    "shuffle": "spec.training.shuffle",
    "steps_per_task": "spec.training.stepsPerTask",
    "max_task_retries": "spec.training.maxTaskRetries",
    "preflight": "spec.training.preflight",
    "nan_policy": "spec.training.nanPolicy",
    "ps": "spec.replicaSpecs.ps.replicas",
    "ps_mode": "spec.replicaSpecs.ps.psMode",
    "grads_to_wait": "spec.replicaSpecs.ps.gradsToWait",
    "ps_checkpoint_steps": "spec.replicaSpecs.ps.psCheckpointSteps",
    "ps_wal": "spec.replicaSpecs.ps.psWal",
}
_LOCAL_JOB_KINDS = "an ElasticJob is a training job; evaluation/prediction jobs (flextrain evaluate/predict) run locally"
NOT_IN_CRD = {
    "backend": "an ElasticJob is the kubernetes backend by definition",
    "job_type": _LOCAL_JOB_KINDS,
    "checkpoint": _LOCAL_JOB_KINDS,
    "output": _LOCAL_JOB_KINDS,
}
# Spec names that differ from the camelCase of the JobSpec field (DESIGN fixes them; the CRD header lists them).
RENAMED = {"workers": "replicas", "min_workers": "minReplicas", "max_workers": "maxReplicas", "ps": "replicas",
           "training_data": "training", "validation_data": "validation", "prediction_data": "prediction"}


def camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.title() for part in rest)


def test_crd_validates_strictly_against_the_kubernetes_schemas(crd):
    for version in kube_versions():
        assert kubernetes_validate.validate(crd, version, strict=True)


def test_chart_ships_the_same_crd_file():
    assert (CHART_DIR / "crds" / "elasticjobs.yaml").read_bytes() == CRD_PATH.read_bytes(), \
        "charts/flextrain/crds/elasticjobs.yaml differs from manifests/crd.yaml: copy the latter over"


def test_names_are_the_ones_in_k8s_meta(crd):
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == f"{meta.PLURAL}.{meta.GROUP}"
    assert crd["spec"]["group"] == meta.GROUP
    assert crd["spec"]["scope"] == "Namespaced"
    assert (names["kind"], names["plural"], names["singular"]) == (meta.KIND, meta.PLURAL, meta.SINGULAR)
    assert meta.SHORT_NAME in names["shortNames"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == meta.VERSION and version["served"] and version["storage"]


def test_schema_is_structural(crd):
    """Every node is typed, and no object silently prunes everything (the API server refuses non-structural CRDs)."""
    schema = crd_schema(crd)
    for path, node in schema_nodes(schema):
        if node.get("x-kubernetes-int-or-string"):
            assert [alt["type"] for alt in node["anyOf"]] == ["integer", "string"], path
            continue
        if node.get("x-kubernetes-preserve-unknown-fields") and "type" not in node:
            assert path == ".status.metrics.*", f"{path}: only a metric may be untyped (a number or \"nan\")"
            continue  # the one other exception Kubernetes makes to "every node is typed"
        assert "type" in node, f"schema node {path or '<root>'} has no type"
        if node["type"] == "object" and path != ".metadata":
            assert ("properties" in node or "additionalProperties" in node
                    or node.get("x-kubernetes-preserve-unknown-fields")), \
                f"object {path} declares no fields: the API server would prune all of them"
        if "properties" in node:
            assert "additionalProperties" not in node, f"{path}: properties and additionalProperties exclude each other"
        for key in node.get("required", []):
            assert key in node.get("properties", {}), f"{path} requires undeclared field {key!r}"


def test_scale_subresource_maps_to_worker_replicas(crd):
    (version,) = crd["spec"]["versions"]
    schema = crd_schema(crd)
    scale = version["subresources"]["scale"]
    assert "status" in version["subresources"]
    assert scale["specReplicasPath"] == ".spec.replicaSpecs.worker.replicas"
    assert scale["statusReplicasPath"] == ".status.workers.active"
    assert resolve(schema, scale["specReplicasPath"])["type"] == "integer"
    assert resolve(schema, scale["statusReplicasPath"])["type"] == "integer"
    assert resolve(schema, scale["labelSelectorPath"])["type"] == "string"


def test_printer_columns_read_declared_fields(crd):
    (version,) = crd["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    default_columns = [c["name"] for c in columns if not c.get("priority")]
    assert default_columns == ["Phase", "Workers", "Progress", "Age"]
    schema = crd_schema(crd)
    for column in columns:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            continue
        node = resolve(schema, column["jsonPath"])
        assert node["type"] == column["type"], f"column {column['name']}: {node['type']} shown as {column['type']}"


def test_status_phase_enum_is_the_job_phases(crd):
    status = crd_schema(crd)["properties"]["status"]
    assert status["properties"]["phase"]["enum"] == ["Pending", "Running", "Succeeded", "Failed"]
    for field in ("conditions", "workers", "epoch", "progress", "metrics", "message", "startTime", "completionTime"):
        assert field in status["properties"], f"status.{field} missing"


CEL_RULES = [(path, rule["rule"]) for path, node in schema_nodes(crd_schema(load_docs(CRD_PATH)[0]))
             for rule in node.get("x-kubernetes-validations", [])]


def test_crd_has_the_replica_range_rules():
    assert any("minReplicas <= self.replicas" in rule for _, rule in CEL_RULES)
    assert any("self.replicas <= self.maxReplicas" in rule for _, rule in CEL_RULES)


@pytest.mark.parametrize("path, rule", CEL_RULES)
def test_cel_rules_name_declared_fields(crd, path, rule):
    """No CEL evaluator runs here; at least every `self.a.b` a rule reads must exist where the rule sits."""
    node = resolve(crd_schema(crd), path) if path else crd_schema(crd)
    refs = re.findall(r"\bself((?:\.[A-Za-z_]\w*)+)", rule)
    assert refs, rule
    for ref in refs:
        resolve(node, ref)


def test_every_jobspec_field_has_a_place_in_the_crd():
    fields = {f.name for f in dataclasses.fields(JobSpec)}
    missing = sorted(fields - FIELD_PATHS.keys() - NOT_IN_CRD.keys())
    assert not missing, (f"JobSpec fields without an ElasticJob field: {missing}; add them to manifests/crd.yaml "
                         "and FIELD_PATHS in tests/k8s_static/test_crd_schema.py (or NOT_IN_CRD with the reason)")


@pytest.mark.parametrize("field", [f for f in dataclasses.fields(JobSpec) if f.name in FIELD_PATHS
                                   and FIELD_PATHS[f.name].startswith("spec.")], ids=lambda f: f.name)
def test_crd_field_is_named_and_defaulted_like_the_jobspec(crd, field):
    path = FIELD_PATHS[field.name]
    parent_path, leaf = path.rsplit(".", 1)
    parent = resolve(crd_schema(crd), "." + parent_path)
    node = parent["properties"][leaf]
    assert leaf == RENAMED.get(field.name, camel(field.name))
    if leaf in parent.get("required", []):
        assert "default" not in node, f"{path} is required; a default would never apply"
        return
    has_default = field.default is not dataclasses.MISSING and field.default is not None
    if has_default:
        default = field.default.value if isinstance(field.default, Strategy) else field.default
        assert node.get("default") == default, f"{path}: CRD default {node.get('default')!r} != JobSpec {default!r}"
        assert type(node["default"]) is type(default), f"{path}: default of the wrong type"
    else:
        assert "default" not in node, f"{path}: JobSpec has no default, the CRD must not invent one"


def test_strategy_enum_is_the_jobspec_strategies(crd):
    node = resolve(crd_schema(crd), ".spec.strategy")
    assert node["enum"] == [s.value for s in Strategy]
