"""Reading an ElasticJob dict as the operator's parts need it: identity, phase, spec problems."""

from __future__ import annotations

from flextrain.k8s.resource import problems

TERMINAL = ("Succeeded", "Failed")


def phase_of(job: dict | None) -> str | None:
    return ((job or {}).get("status") or {}).get("phase")


def ident(job: dict) -> tuple[str, str]:
    md = job["metadata"]
    return md["namespace"], md["name"]


def spec_problems(job: dict) -> str | None:
    """Every problem of a job's spec, one per line, each starting with its field path; or None."""
    found = problems(job)
    return "\n".join(found) if found else None


__all__ = ["TERMINAL", "ident", "phase_of", "spec_problems"]
