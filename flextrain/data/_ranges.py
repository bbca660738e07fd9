"""Record-range validation shared by the RecordIO and CSV readers."""

from __future__ import annotations

import operator


def check_range(path: str, start: int, end: int | None, total: int) -> tuple[int, int]:
    """Return ``(start, end)`` with ``end=None`` meaning ``total``.

    Raises ValueError naming ``path`` unless ``0 <= start <= end <= total``.
    """
    if end is None:
        end = total
    # operator.index accepts numpy integers but rejects floats and strings.
    start, end = operator.index(start), operator.index(end)
    if not 0 <= start <= end <= total:
        raise ValueError(f"record range [{start}, {end}) out of bounds for {path} which has {total} records")
    return start, end
