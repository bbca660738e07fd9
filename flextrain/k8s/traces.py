"""An ElasticJob's batch-size trace (``spec.training.batchSchedule``), checked by the operator.

The field holds the trace's CSV text inline (a value with a line break) or a
path inside the pods (e.g. a ConfigMap mounted through ``spec.volumes``).
Inline text is parsed here, so a bad trace fails the ElasticJob naming its
line before any pod starts; a path cannot be read by the operator: the
master reads and checks it at its start (and fails the job the same way).
"""

from __future__ import annotations

from typing import Any

from flextrain.elastic.schedule import BatchSchedule, ScheduleError


def inline_trace_problems(value: Any, *, path: str) -> list[str]:
    """``[message]`` naming ``path`` and the line of a bad inline trace; ``[]`` for a good one or a path."""
    if not isinstance(value, str) or "\n" not in value.strip():
        return []
    try:
        BatchSchedule.parse(value, source=path)
    except ScheduleError as exc:
        return [str(exc)]
    return []


__all__ = ["inline_trace_problems"]
