"""The phase of a job, as status.json, the CR status and ``flextrain status`` name it."""

from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


__all__ = ["Phase"]
