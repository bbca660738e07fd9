"""The phase of a job, as status.json, the CR status and ``flextrain status`` name it."""

from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    # Suspended (flextrain suspend, spec.suspend): checkpointed, every worker released, the master waiting
    # for a resume (flextrain/master/suspension.py). Not an end: the job goes on when resumed.
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


__all__ = ["Phase"]
