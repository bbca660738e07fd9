"""Where a worker gets the records of a task: the one function every call site uses.

A module with ``custom_data_reader`` reads its own data: the task's records come
from ``read_records(task)`` of the reader made for the task's data origin (one
reader per origin per process, :func:`flextrain.data.custom.custom_source`).
Any other module's records come from flextrain's sources (RecordIO, CSV,
Parquet, SQL), projected to the module's ``columns``.
"""

from __future__ import annotations

from flextrain.data import DataOptions, Shard, custom_source, plan_shards, shard_reader
from flextrain.job import JobSpec
from flextrain.worker.contract import Mode

__all__ = ["data_origin", "read_task_records", "task_reader", "job_shards"]

_WHAT = {Mode.TRAINING: "training data", Mode.EVALUATION: "validation data", Mode.PREDICTION: "prediction data"}


def data_origin(spec: JobSpec, mode: Mode | str) -> str | None:
    """The data string the user gave for ``mode``: --training-data, --validation-data or --prediction-data."""
    mode = Mode(mode)
    return {Mode.TRAINING: spec.data.training, Mode.EVALUATION: spec.data.validation,
            Mode.PREDICTION: spec.data.prediction}[mode]


def read_task_records(model_def, source: str, start: int, end: int, *, mode: Mode | str,
                      data_origin: str | None = None) -> list:
    """Records ``[start, end)`` of the shard ``source`` as ``feed`` gets them: a list, or a
    :class:`flextrain.data.RecordBatch` for a module with ``record_batch = True``.

    With the module's ``custom_data_reader``, ``data_origin`` (the data string of ``mode``'s data) names
    the reader; its errors are CustomReaderError (a DataError) naming the module, the shard and the range.
    """
    return task_reader(model_def, source, mode=mode, data_origin=data_origin)(start, end)


def task_reader(model_def, source: str, *, mode: Mode | str, data_origin: str | None = None):
    """``read(start, end)``: :func:`read_task_records` of one shard with its reader found once (a
    trainer reads a task's steps through one: the lookups are not repeated every step)."""
    mode = Mode(mode)
    reader = getattr(model_def, "custom_data_reader", None)
    if reader is None:
        return shard_reader(source, columns=model_def.columns, as_batch=model_def.record_batch)
    if not data_origin:
        raise ValueError(f"reading {source!r} through custom_data_reader needs the {_WHAT[mode]}'s data origin")
    custom = custom_source(reader, data_origin, what=_WHAT[mode])
    return lambda start, end: custom.read(source, start, end, mode=mode.value)


def job_shards(spec: JobSpec, mode: Mode | str, *, reader=None, skipped: list[str] | None = None,
               columns: tuple[str, ...] | None = None) -> list[Shard]:
    """The shards of ``spec``'s data for ``mode``, planned by ``reader`` (a ``custom_data_reader``) if given;
    with ``columns`` (the module's) every Parquet file and table must have them."""
    mode = Mode(mode)
    return plan_shards(data_origin(spec, mode), what=_WHAT[mode], reader=reader,
                       options=DataOptions.of(spec.data, columns=columns), skipped=[] if skipped is None else skipped)
