"""Fixtures of the static checks; the loaders they use live in k8s_static_support.py."""

from __future__ import annotations

import jsonschema
import pytest
from k8s_static_support import CRD_PATH, crd_schema, load_docs, strict_schema


@pytest.fixture(scope="session")
def crd() -> dict:
    (doc,) = load_docs(CRD_PATH)
    return doc


@pytest.fixture(scope="session")
def elasticjob_validator(crd) -> jsonschema.Draft4Validator:
    """A validator of whole ElasticJob objects by the CRD's openAPIV3Schema.

    Why this is faithful: a CRD schema must be *structural* (every node typed,
    no free-form polymorphism; test_crd_schema checks it), and for structural
    schemas the API server's validation is the OpenAPI v3.0 schema-object
    semantics, which are JSON Schema draft 4 (boolean ``exclusiveMinimum``,
    ``anyOf`` for int-or-string quantities). ``x-kubernetes-*`` keys are
    unknown keywords to jsonschema and are ignored, which matches their
    meaning: they steer pruning, merging and CEL, not schema validation.

    What it does not cover: the CEL rules (``x-kubernetes-validations``: no CEL
    evaluator here; test_crd_schema checks that each rule names real fields, the
    operator enforces the same constraints), defaulting, ``format`` checks on
    status timestamps, and ``metadata`` (names are validated by the API server
    itself, not by the CRD schema).
    """
    schema = strict_schema(crd_schema(crd))
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)
