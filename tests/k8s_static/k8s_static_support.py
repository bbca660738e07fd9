"""Shared loaders for the static checks of the deployable artefacts (CRD, chart, manifests, Dockerfile).

Nothing here talks to a cluster: the chart is rendered and linted offline by
helm-python-sdk (Helm's Go SDK through ctypes), Kubernetes objects are checked
against the published OpenAPI schemas bundled with kubernetes-validate, and
ElasticJob objects against the CRD's own schema (see ``elasticjob_validator``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "manifests" / "crd.yaml"
CHART_DIR = REPO / "charts" / "flextrain"
EXAMPLES = REPO / "manifests" / "examples"


def load_docs(path: Path) -> list[dict]:
    """Every non-empty YAML document of ``path``."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kube_versions() -> tuple[str, str]:
    """The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema set we have."""
    import kubernetes_validate

    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    oldest = chart["kubeVersion"].lstrip(">=").split("-")[0]
    return oldest, kubernetes_validate.latest_version()


def crd_schema(crd: dict) -> dict:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def schema_nodes(node: dict, path: str = "") -> Iterator[tuple[str, dict]]:
    """Every sub-schema reachable through properties / items / additionalProperties, with its dotted path."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}.*")


def resolve(schema: dict, dotted: str) -> dict:
    """The sub-schema at a JSONPath-like ``.a.b.c`` (as CRD printer columns and scale paths spell them)."""
    node = schema
    for part in dotted.strip(".").split("."):
        props = node.get("properties", {})
        if part not in props:
            raise KeyError(f"{dotted!r}: no property {part!r} in the schema")
        node = props[part]
    return node


def strict_schema(schema: dict) -> dict:
    """The CRD schema as the API server applies it to a `kubectl apply` with strict field validation.

    The API server prunes fields its structural schema does not declare; kubectl
    (>= 1.27, ``--validate=strict``, its default) asks it to reject them instead.
    ``additionalProperties: false`` on every object that declares its
    properties - and does not preserve unknown fields - is exactly that rule.
    """
    out = copy.deepcopy(schema)
    for _, node in schema_nodes(out):
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
    return out


def render_chart(values: dict[str, Any] | None = None, *, namespace: str = "ml-team",
                 release: str = "flextrain") -> dict[str, str]:
    """The chart's rendered templates (file name -> text), offline."""
    import helm_python as helm

    chart = helm.Chart.load(str(CHART_DIR))
    rendered = chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    return {path.rsplit("/", 1)[-1]: text for path, text in rendered.items()}


def rendered_objects(values: dict[str, Any] | None = None, **kw) -> list[dict]:
    """Every Kubernetes object the chart's templates render to (NOTES.txt excluded)."""
    out = []
    for name, text in sorted(render_chart(values, **kw).items()):
        if name.endswith(".yaml"):
            out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def rights(role: dict) -> dict[str, set[str]]:
    """A Role's rules as ``{"group/resource": verbs}`` (core resources without the group)."""
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault(f"{group}/{resource}".lstrip("/"), set()).update(rule["verbs"])
    return out


# The two value sets every chart check runs with.
CHART_VALUE_SETS = {
    "namespaced": {},
    "all-namespaces": {"watchAllNamespaces": True, "jobServiceAccount": {"extraNamespaces": ["team-a", "team-b"]}},
}
