"""The ElasticJob CRD: a valid, structural apiextensions/v1 object whose names match the rest of flextrain."""

from __future__ import annotations

import dataclasses
import enum
import re

import kubernetes_validate
import pytest
from k8s_static_support import (
    CHART_DIR,
    CRD_PATH,
    REPO,
    crd_schema,
    kube_versions,
    load_docs,
    resolve,
    schema_nodes,
)

from flextrain.job import KUBERNETES_DEFAULTS, SECTIONS, SETTING, SETTINGS, JobSpec, Strategy
from flextrain.k8s import meta

# The settings JobSpec has that an ElasticJob does not (the table's CRD column is None), and why.
NOT_IN_CRD = {
    "backend": "an ElasticJob is the kubernetes backend by definition",
    "worker_memory_limit": "a pod's memory limit is its resources.limits.memory (and replicaSpecs.worker.memoryLadder)",
}


def test_crd_validates_strictly_against_the_kubernetes_schemas(crd):
    for version in kube_versions():
        assert kubernetes_validate.validate(crd, version, strict=True)


def test_chart_manifests_and_package_ship_the_same_crd_file():
    source = (CHART_DIR / "crds" / "elasticjobs.yaml").read_bytes()
    for copy in (CRD_PATH, REPO / "flextrain" / "k8s" / "crd.yaml"):  # the package's: `flextrain validate` reads it
        assert copy.read_bytes() == source, \
            f"{copy} differs from charts/flextrain/crds/elasticjobs.yaml: run .venv/bin/python manifests/generate.py"


def test_pod_templates_are_declared_and_kept_whole(crd):
    replica_specs = crd_schema(crd)["properties"]["spec"]["properties"]["replicaSpecs"]["properties"]
    for role in ("master", "worker", "ps"):
        node = replica_specs[role]["properties"]["template"]
        assert node["type"] == "object" and node["x-kubernetes-preserve-unknown-fields"] is True, role


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
            assert path in (".status.metrics.*", ".status.evaluation.metrics.*"), \
                f"{path}: only a metric may be untyped (a number or \"nan\")"
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
    assert status["properties"]["phase"]["enum"] == ["Pending", "Running", "Suspended", "Succeeded", "Failed"]
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


def test_every_setting_has_a_place_in_the_crd_or_a_reason():
    missing = sorted(s.key for s in SETTINGS if s.crd is None and s.key not in NOT_IN_CRD)
    assert not missing, (f"settings without an ElasticJob field: {missing}; add them to manifests/crd.yaml and "
                         "their CRD path to flextrain/job/settings.py SETTINGS (or to NOT_IN_CRD with the reason)")
    assert not [k for k in NOT_IN_CRD if SETTING[k].crd], "NOT_IN_CRD lists a setting that has a CRD field"


def _default(setting):
    """The default of a setting for a Kubernetes job: KUBERNETES_DEFAULTS', else its section dataclass's field
    default (the local one)."""
    if setting.key in KUBERNETES_DEFAULTS:
        return KUBERNETES_DEFAULTS[setting.key]
    section, _, leaf = setting.path.rpartition(".")
    owner = SECTIONS[section] if section else JobSpec
    field = next(f for f in dataclasses.fields(owner) if f.name == leaf)
    return field.default


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.crd and s.crd.startswith("spec.")], ids=lambda s: s.key)
def test_crd_field_is_where_the_table_says_and_defaulted_like_the_jobspec(crd, setting):
    parent_path, leaf = setting.crd.rsplit(".", 1)
    parent = resolve(crd_schema(crd), "." + parent_path)
    assert leaf in parent["properties"], f"{setting.crd} (SETTINGS) is not in manifests/crd.yaml"
    node = parent["properties"][leaf]
    if leaf in parent.get("required", []):
        assert "default" not in node, f"{setting.crd} is required; a default would never apply"
        return
    default = _default(setting)
    if default == ():  # no script arguments: the field absent (a CRD default would put [] on every job)
        default = None
    if default is not dataclasses.MISSING and default is not None:
        default = default.value if isinstance(default, enum.Enum) else default
        assert node.get("default") == default, f"{setting.crd}: CRD default {node.get('default')!r} != JobSpec {default!r}"
        assert type(node["default"]) is type(default), f"{setting.crd}: default of the wrong type"
    else:
        assert "default" not in node, f"{setting.crd}: JobSpec has no default, the CRD must not invent one"


def test_strategy_enum_is_the_jobspec_strategies(crd):
    node = resolve(crd_schema(crd), ".spec.strategy")
    assert node["enum"] == [s.value for s in Strategy]


def test_job_type_enum_is_the_jobspec_job_types(crd):
    from flextrain.job import JobType

    assert resolve(crd_schema(crd), ".spec.jobType")["enum"] == [t.value for t in JobType]


def test_the_packaged_schema_reads_openapi_bounds_and_refuses_unknown_fields():
    """flextrain.k8s.crdschema (what `flextrain validate` uses): OpenAPI 3.0's boolean exclusiveMinimum
    bounds learningRate from below without refusing 0.1; undeclared fields are errors at their own path."""
    from flextrain.k8s import crdschema

    (job,) = load_docs(REPO / "manifests" / "examples" / "digits-allreduce.yaml")
    assert crdschema.problems(job) == []
    job["spec"]["training"] = {"learningRate": 0.1, "epoch": 2}
    assert crdschema.problems(job) == ["spec.training.epoch: unknown field"]
    job["spec"]["training"] = {"learningRate": 0}
    job["spec"]["jobType"] = "inference"
    assert [p.split(":")[0] for p in crdschema.problems(job)] == ["spec.jobType", "spec.training.learningRate"]
