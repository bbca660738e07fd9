"""Prediction output written back to a SQL table (``flextrain predict --output 'sqlite:///out.db?table=preds'``).

The table holds one row per input record, as the JSON-lines parts do
(:mod:`flextrain.data.predictions`): ``task_id`` (the prediction task), ``source`` and
``record_index`` (the record's data source and position in it) and ``prediction`` (the model's
output as JSON text). A worker writes a task's rows in one transaction that first deletes any
rows of that task, so a task that failed part-way and ran again (on any worker) leaves exactly
one row per record. At the end the master checks every task's row count against its plan.

The table is created at submission if missing; one that already holds rows, or has other
columns, is refused (predictions are never mixed with an earlier run's).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from flextrain.data.errors import DataError
from flextrain.data.sql import TableRef, _connect, _words

__all__ = ["OUTPUT_COLUMNS", "check_output_rows", "prepare_output_table", "read_output_rows", "write_task_rows"]

OUTPUT_COLUMNS = ("task_id", "source", "record_index", "prediction")


def _table(ref: TableRef, conn, *, create: bool):
    from sqlalchemy import BigInteger, Column, MetaData, Table, Text, inspect

    schema, _, name = ref.table.rpartition(".")
    table = Table(name, MetaData(), Column("task_id", BigInteger, index=True), Column("source", Text),
                  Column("record_index", BigInteger), Column("prediction", Text), schema=schema or None)
    if inspect(conn).has_table(name, schema=schema or None):
        have = [c["name"] for c in inspect(conn).get_columns(name, schema=schema or None)]
        if sorted(have) != sorted(OUTPUT_COLUMNS):
            raise DataError(f"--output: {ref.shown()} exists with columns {', '.join(have)}; prediction output needs "
                            f"a new table or one with exactly {', '.join(OUTPUT_COLUMNS)}")
    elif create:
        table.create(conn)
    return table


def prepare_output_table(url: str) -> None:
    """At submission: create the output table if missing; refuse one with rows or other columns."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    ref = TableRef.parse(url, what="--output")
    with _connect(ref, what="--output") as conn:
        try:
            table = _table(ref, conn, create=True)
            n = conn.execute(select(func.count()).select_from(table)).scalar_one()
            conn.commit()
        except SQLAlchemyError as exc:
            raise DataError(f"--output: preparing {ref.shown()} failed: {_words(exc)}") from None
    if n:
        raise DataError(f"--output: {ref.shown()} already holds {n} predictions; choose a new or empty table")


def write_task_rows(url: str, task_id: int, rows: Iterable[dict[str, Any]]) -> int:
    """Replace prediction task ``task_id``'s rows with ``rows`` (dicts with source, index,
    prediction), in one transaction; returns how many were written."""
    from sqlalchemy.exc import SQLAlchemyError

    ref = TableRef.parse(url, what="--output")
    values = [{"task_id": task_id, "source": r["source"], "record_index": r["index"],
               "prediction": json.dumps(r["prediction"], allow_nan=True)} for r in rows]
    with _connect(ref, what="--output") as conn:
        try:
            table = _table(ref, conn, create=True)
            # One transaction (SQLAlchemy's autobegun one), committed once: the delete and the inserts
            # land together or not at all.
            conn.execute(table.delete().where(table.c.task_id == task_id))
            if values:
                conn.execute(table.insert(), values)
            conn.commit()
        except SQLAlchemyError as exc:
            raise DataError(f"writing the predictions of task {task_id} to {ref.shown()} failed: {_words(exc)}") from None
    return len(values)


def check_output_rows(url: str, plan: Sequence[tuple[int, str, int, int]]) -> int:
    """Check each planned task ``(task_id, source, start, end)`` has ``end - start`` rows; returns the total."""
    from sqlalchemy import func, select

    ref = TableRef.parse(url, what="--output")
    with _connect(ref, what="--output") as conn:
        table = _table(ref, conn, create=False)
        counts = dict(conn.execute(select(table.c.task_id, func.count()).group_by(table.c.task_id)).all())
    total = 0
    for task_id, source, start, end in plan:
        got = counts.get(task_id, 0)
        if got != end - start:
            raise DataError(f"{ref.shown()} holds {got} rows of task {task_id} for the {end - start} records of "
                            f"{source} [{start}, {end})")
        total += got
    return total


def read_output_rows(url: str) -> list[dict[str, Any]]:
    """Every row, in input order (task, then record), with ``prediction`` decoded from JSON."""
    from sqlalchemy import select

    ref = TableRef.parse(url, what="--output")
    with _connect(ref, what="--output") as conn:
        table = _table(ref, conn, create=False)
        rows = conn.execute(select(table).order_by(table.c.task_id, table.c.record_index)).mappings().all()
    return [{"source": r["source"], "index": r["record_index"], "prediction": json.loads(r["prediction"])}
            for r in rows]
