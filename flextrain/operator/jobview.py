"""Reading an ElasticJob dict as the operator's parts need it: identity, phase, spec problems."""

from __future__ import annotations

from flextrain.k8s.resource import problems

TERMINAL = ("Succeeded", "Failed")


def phase_of(job: dict | None) -> str | None:
    return ((job or {}).get("status") or {}).get("phase")


def ident(job: dict) -> tuple[str, str]:
    md = job["metadata"]
    return md["namespace"], md["name"]


def accelerate_problems(job: dict) -> list[str]:
    """``spec.training.accelerate`` read as the workers read it (flextrain.accelerate.jobs: an unknown method,
    a bad config, a method a job refuses, each named); [] when unset or not a string (problems() says so)."""
    training = (job.get("spec") or {}).get("training") if isinstance(job.get("spec"), dict) else None
    value = training.get("accelerate") if isinstance(training, dict) else None
    if not isinstance(value, str) or not value.strip():
        return []
    from flextrain.accelerate import AccelerateError  # imports torch: only for a job that sets it
    from flextrain.accelerate.jobs import check_setting

    try:
        check_setting(value, what="spec.training.accelerate")
    except AccelerateError as exc:
        return [str(exc)]
    return []


def spec_problems(job: dict) -> str | None:
    """Every problem of a job's spec, one per line, each starting with its field path; or None."""
    found = problems(job) + accelerate_problems(job)
    return "\n".join(found) if found else None


__all__ = ["TERMINAL", "accelerate_problems", "ident", "phase_of", "spec_problems"]
