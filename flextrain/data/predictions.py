"""The output format of a prediction job (``flextrain predict --output DIR``).

``DIR`` holds one JSON-lines file per prediction task, ``part-<task id>.jsonl``
(six digits, zero-padded), and ``manifest.json``, written by the master once
every task is done. Task ids increase with the position of the records (the
prediction data's files in sorted order, records in file order), so reading
the parts in the manifest's order gives the predictions in input order.

Each line is one input record::

    {"source": "/data/pred/part-0.rio", "index": 17, "prediction": [0.1, 2.3]}

``source`` is the data file, ``index`` the record's position in it (0-based)
and ``prediction`` the model's output for that record as nested lists (a
dict of them when the model returns a dict, a list of them for a tuple).

``manifest.json``: ``{"format": "jsonl", "rows": N, "parts": [{"file",
"source", "start", "end", "rows"}, ...]}`` with ``end - start == rows`` for
every part, in input order.

A worker writes a part under a temporary name and renames it when the whole
task is written, so a task that fails part-way and is retried (by any
worker) leaves exactly one file with one row per record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

MANIFEST = "manifest.json"
FORMAT = "jsonl"


def part_name(task_id: int) -> str:
    return f"part-{task_id:06d}.jsonl"


def write_part(directory: str | Path, task_id: int, rows: Iterable[dict[str, Any]], *, writer: str) -> Path:
    """Write one task's rows atomically; returns the part's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / part_name(task_id)
    tmp = directory / f".{final.name}.{writer}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, allow_nan=True))
            f.write("\n")
    os.replace(tmp, final)  # a retried task replaces, never duplicates
    return final


def count_rows(path: str | Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def read_predictions(directory: str | Path) -> list[dict[str, Any]]:
    """Every row of a finished prediction job, in input order (via the manifest)."""
    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST).read_text())
    rows = []
    for part in manifest["parts"]:
        with open(directory / part["file"], encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f)
    return rows
