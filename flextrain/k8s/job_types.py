"""``spec.jobType``: what an ElasticJob of each job type must name, and its result in the job's status.

A ``training`` job (the default) trains ``modelDef`` on ``data.training``. An
``evaluation`` job runs the model of ``checkpoint`` over ``data.validation``
with the module's ``eval_metrics_fn``; a ``prediction`` job runs it over
``data.prediction`` and writes one prediction per record to ``output``. The
master and the workers run them exactly as ``flextrain evaluate`` /
``flextrain predict`` do locally (flextrain/master/evaluation.py).

:func:`required_problems` is what :func:`flextrain.k8s.resource.problems`
reports for a missing field, every one at once, each starting with its path;
:func:`parse` turns the field's value into a :class:`JobType`;
:func:`result_status` is the part of the CR status that holds the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flextrain.job import JobType

FIELD = "spec.jobType"
# The fields a module job of each type needs (below ``spec``), and why.
NEEDS: dict[JobType, tuple[tuple[str, str], ...]] = {
    JobType.TRAINING: (("modelDef", ""), ("data.training", "")),
    JobType.EVALUATION: (
        ("modelDef", ""),
        ("checkpoint", "the checkpoint file, or a training job's jobDir, in the pods"),
        ("data.validation", "the records to evaluate on"),
    ),
    JobType.PREDICTION: (
        ("modelDef", ""),
        ("checkpoint", "the checkpoint file, or a training job's jobDir, in the pods"),
        ("data.prediction", "the records to predict on"),
        ("output", "where the predictions go: a new or empty directory on a volume of the job"),
    ),
}


def parse(value: Any) -> tuple[JobType | None, str | None]:
    """``(job type, None)``, or ``(None, problem)`` for a value that is none of them (None means training)."""
    if value is None:
        return JobType.TRAINING, None
    try:
        return JobType(value), None
    except ValueError:
        return None, f"{FIELD}: must be {' | '.join(t.value for t in JobType)}, got {value!r}"


def required_problems(spec: Mapping[str, Any], get) -> list[str]:
    """A message for each field the job's type needs and ``spec`` lacks (``get(spec, dotted)`` reads one).

    A script job needs none of them (a script job of another type is refused by JobSpec's own check);
    an unknown job type needs only ``modelDef`` (its own problem is reported by :func:`parse`).
    """
    if get(spec, "script") not in (None, ""):
        return []
    job_type, _ = parse(get(spec, "jobType"))
    out = []
    for path, why in NEEDS.get(job_type, NEEDS[JobType.TRAINING][:1]):
        if get(spec, path) in (None, ""):
            if path == "modelDef":
                out.append("spec.modelDef: is required (or spec.script, for a script job)")
            elif job_type is JobType.TRAINING:
                out.append(f"spec.{path}: is required")
            else:
                out.append(f"spec.{path}: is required for jobType {job_type.value} ({why})")
    return out


def result_status(snap: Mapping[str, Any]) -> dict[str, Any]:
    """``evaluation`` (the latest finished evaluation) and ``prediction`` (output, records) of the CR status,
    from a status snapshot (what ``status.json`` holds); {} when there is neither."""
    out: dict[str, Any] = {}
    evaluations = snap.get("evaluations") or []
    if evaluations:
        last = evaluations[-1]
        out["evaluation"] = {"step": int(last.get("step", 0)), "samples": int(last.get("samples", 0)),
                             "metrics": {k: v if isinstance(v, str) else float(v)
                                         for k, v in (last.get("metrics") or {}).items()}}
    prediction = snap.get("prediction")
    if isinstance(prediction, Mapping) and prediction.get("output"):
        out["prediction"] = {"output": str(prediction["output"]),
                             **({"records": int(prediction["records"])} if prediction.get("records") is not None
                                else {})}
    return out


__all__ = ["FIELD", "NEEDS", "parse", "required_problems", "result_status"]
