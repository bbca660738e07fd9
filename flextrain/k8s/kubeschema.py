"""Kubernetes' own OpenAPI schema for pieces of an ElasticJob (pod templates, volumes).

The CRD lets ``spec.volumes[]`` and the pod templates carry any PodSpec
field (``x-kubernetes-preserve-unknown-fields``), so the API server checks
them only when a pod is created, long after the job was accepted; and
``kubectl apply --validate=false`` lets a typo such as ``persistentVolumeClam``
through. The operator and ``flextrain validate`` therefore check these parts
at admission against Kubernetes' strict JSON schema (kubernetes-validate's
copy of the API's definitions: unknown fields are errors), reporting every
problem with its ElasticJob path.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

# Definitions checked against: the newest the installed kubernetes-validate has. A newer schema knows
# more fields; the strict variant refuses unknown ones either way.
DEFS_ID = "https://kubernetes.io/api/_definitions.json"


@functools.lru_cache(maxsize=1)
def _registry():
    import kubernetes_validate
    from kubernetes_validate.utils import schema_contents
    from referencing import Registry, Resource

    version = kubernetes_validate.latest_version()
    defs = schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)
    return Resource.from_contents(defs) @ Registry(), version


@functools.lru_cache(maxsize=16)
def _validator(definition: str):
    import jsonschema

    registry, _ = _registry()
    return jsonschema.validators.Draft202012Validator({"$ref": f"{DEFS_ID}#/$defs/{definition}"}, registry=registry)


def schema_version() -> str:
    """The Kubernetes version whose schema is used (e.g. ``1.37.0``)."""
    return _registry()[1]


def _where(path: str, error) -> str:
    out = path
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _leaves(error) -> Iterator:
    """The most specific errors: an ``anyOf``/``oneOf`` failure is explained by its sub-errors."""
    if error.context:
        best = min(error.context, key=lambda e: len(list(e.context)) if e.context else 0)
        yield from _leaves(best)
    else:
        yield error


def problems(value: Any, definition: str, *, path: str) -> list[str]:
    """Every way ``value`` is not a valid ``definition`` (e.g. ``io.k8s.api.core.v1.PodSpec``), each
    message starting with ``path`` extended by the field it concerns."""
    out = []
    for error in sorted(_validator(definition).iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        for leaf in _leaves(error):
            message = leaf.message
            if leaf.validator == "additionalProperties":
                message = message.replace("Additional properties are not allowed", "unknown field")
            out.append(f"{_where(path, leaf)}: {message}")
    return list(dict.fromkeys(out))


__all__ = ["problems", "schema_version"]
