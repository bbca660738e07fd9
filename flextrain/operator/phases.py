"""Which phases a job entered between two looks of the operator, for the ``Job<Phase>`` Events.

The operator learns of phase changes from a kopf field handler on
``status.phase``. kopf hands it the phase it handled last (kept in the job's
``kopf.zalando.org/last-handled-configuration`` annotation, so it survives an
operator restart) and the phase now; between the two the job may have passed
through others that no watch event showed the operator (kopf processes only
the newest state of an object, and a quick job goes Pending -> Running ->
Succeeded within one status write of its master). :func:`phases_entered`
fills those in from what the status proves:

* ``Pending``: written by the operator together with ``masterRelaunches``
  when it created the master; a job refused at creation goes straight to
  ``Failed`` and has no ``masterRelaunches``.
* ``Running``: a job that ``Succeeded`` ran; a ``Failed`` one ran if it
  trained a step or a record. A job that failed after the master started
  training but before its first step, unseen by the operator, gets no
  ``JobRunning`` (nothing in the status tells that apart from a job that
  failed while starting).

Each phase is entered at most once per job (the order is strict and the
terminal phases are final), so an Event keyed by (job uid, phase) is recorded
exactly once however often the handler runs.
"""

from __future__ import annotations

from typing import Any

_RANK = {"Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2}


def _ran(status: dict[str, Any]) -> bool:
    progress = status.get("progress") or {}
    return bool(status.get("step") or progress.get("recordsDone"))


def phases_entered(old: str | None, new: str, status: dict[str, Any]) -> list[tuple[str | None, str, bool]]:
    """``(previous, phase, derived)`` for each phase entered going ``old`` -> ``new``, oldest first.

    ``derived`` is True for a phase the operator did not see but the status
    proves (see the module docstring). An unknown phase is reported as it is,
    without derivation; a move backwards (which no writer makes) as well.
    """
    if new not in _RANK or (old is not None and old not in _RANK) or new == old:
        return [(old, new, False)] if new != old else []
    start = -1 if old is None else _RANK[old]
    chain: list[str] = []
    if start < 0 and new != "Pending" and status.get("masterRelaunches") is not None:
        chain.append("Pending")
    if start < 1 < _RANK[new] and (new == "Succeeded" or _ran(status)):
        chain.append("Running")
    out, previous = [], old
    for phase in chain:
        out.append((previous, phase, True))
        previous = phase
    out.append((previous, new, False))
    return out


__all__ = ["phases_entered"]
