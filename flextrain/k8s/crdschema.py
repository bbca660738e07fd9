"""The ElasticJob CRD's own schema, applied offline as the API server applies it.

The CRD travels inside the package (``flextrain/k8s/crd.yaml``, a byte copy of
``charts/flextrain/crds/elasticjobs.yaml`` written by ``manifests/generate.py``):
an installed flextrain (the Docker image, a wheel) has no ``charts/`` or
``manifests/`` to read it from, and ``flextrain validate`` must check against
the very schema the cluster was given.

The schema is OpenAPI 3.0, not JSON Schema of a recent draft: its
``exclusiveMinimum: true`` is a boolean modifier of ``minimum`` (draft 4's
meaning; draft 6 and later read a number there, so ``learningRate: 0.1`` would
fail). It is therefore validated with jsonschema's Draft 4 validator, after
:func:`json_schema` turns the OpenAPI-only keywords into draft 4:
``nullable: true`` adds ``null`` to the type; ``x-kubernetes-*`` keywords are
dropped (they steer pruning, merging and CEL, not structural validation); and,
as ``kubectl apply`` with strict field validation does, every object that
declares properties and does not ``x-kubernetes-preserve-unknown-fields``
refuses fields it does not declare. Not covered: the CEL rules
(``x-kubernetes-validations``); the operator's checks
(:func:`flextrain.k8s.resource.problems`) enforce the same constraints.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

CRD_FILE = "crd.yaml"


@functools.lru_cache(maxsize=1)
def crd() -> dict[str, Any]:
    """The ElasticJob CustomResourceDefinition shipped with this flextrain."""
    return yaml.safe_load(resources.files("flextrain.k8s").joinpath(CRD_FILE).read_text())


def openapi_schema() -> dict[str, Any]:
    """The CRD's ``openAPIV3Schema`` (of its one version)."""
    (version,) = crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def json_schema(node: Any) -> Any:
    """An OpenAPI 3.0 schema object as a JSON Schema draft 4 schema (see the module docstring)."""
    if isinstance(node, list):
        return [json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: json_schema(value) for key, value in node.items()
           if not key.startswith("x-kubernetes-") and key not in ("nullable", "properties", "default")}
    if "properties" in node:
        out["properties"] = {name: json_schema(child) for name, child in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    return out


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json_schema(openapi_schema())
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def _where(error) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".") or "(document)"


def problems(obj: Any) -> list[str]:
    """Every way ``obj`` breaks the CRD schema, each message starting with its field path.

    An undeclared field is reported at its own path (``spec.training.epoch: unknown field``),
    a missing required one at its path (``spec.data.training: is required``).
    """
    out = []
    for error in sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        where = _where(error)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            declared = error.schema.get("properties", {})
            out += [f"{where}.{key}: unknown field" for key in error.instance if key not in declared]
        elif error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            out.append(f"{where}.{missing}: is required" if where != "(document)" else f"{missing}: is required")
        elif error.validator == "pattern" and "[KMGTPE]i" in str(error.validator_value):
            # A resource quantity's pattern: say what a quantity looks like, not the regex.
            from flextrain.k8s.apiserver_checks import quantity_problem

            out.append(quantity_problem(where, error.instance) or f"{where}: {error.message}")
        else:
            out.append(f"{where}: {error.message}")
    return list(dict.fromkeys(out))


__all__ = ["crd", "json_schema", "openapi_schema", "problems"]
