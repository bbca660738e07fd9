"""Prediction tasks on the worker: run the model, write one part file per task.

The output format is ``flextrain/data/predictions.py``'s: one JSON line per
input record (``source``, ``index``, ``prediction``), one file per task,
written under a temporary name and renamed once the whole task is written,
so a retried task never leaves duplicate rows.

ElasticDL hook: a module may define ``PredictionOutputsProcessor``, a class
whose instances have ``process(predictions, worker_id)``. Each worker builds
one and calls it once per task, after the task's part file is written, with
the task's predictions as numpy (an array, or a dict/tuple of arrays, whose
first dimension is the task's records in order) and the worker's id. A task
that fails after that call and is retried calls it again for the same records
(at least once, unlike the part files, which are exactly once).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from flextrain.data.predictions import write_part
from flextrain.data.sql import is_sql_url
from flextrain.data.sql_output import write_task_rows
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.evaluation import Predictor, batch_len, to_numpy
from flextrain.worker.module import FeedMetadata, Mode, ModelDef, ModelDefError
from flextrain.worker.reading import read_task_records


def load_outputs_processor(model_def: ModelDef):
    """The module's ``PredictionOutputsProcessor()`` instance, or None when it defines none."""
    cls = getattr(model_def.module, "PredictionOutputsProcessor", None)
    if cls is None:
        return None
    if not callable(cls):
        raise ModelDefError(f"{model_def.path}: PredictionOutputsProcessor must be a class with "
                            f"process(predictions, worker_id), got {type(cls).__name__}")
    try:
        processor = cls()
    except Exception as exc:
        raise ModelDefError(f"{model_def.path}: PredictionOutputsProcessor() failed: {exc!r}") from exc
    process = getattr(processor, "process", None)
    if not callable(process):
        raise ModelDefError(f"{model_def.path}: PredictionOutputsProcessor has no method "
                            "process(predictions, worker_id)")
    try:
        inspect.signature(process).bind(None, None)
    except TypeError as exc:
        raise ModelDefError(f"{model_def.path}: PredictionOutputsProcessor.process{inspect.signature(process)} "
                            "must take (predictions, worker_id)") from exc
    return processor


def _row(value: Any, i: int) -> Any:
    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_row(v, i) for v in value]
    return value[i].tolist()


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    return np.concatenate(parts, axis=0)


def predict_records(model_def: ModelDef, predictor: Predictor, records: list, *, metadata: FeedMetadata,
                    batch_size: int) -> tuple[list[dict], list[Any]]:
    """The output rows of ``records`` (``metadata``: their source and range) and the model's outputs as
    numpy, batch by batch. A ModelDefError when the predictions are not one per record."""
    rows, outputs = [], []
    for predictions, _ in predictor.batches(records, mode=Mode.PREDICTION, metadata=metadata,
                                            batch_size=batch_size):
        values = to_numpy(predictions)
        for i in range(batch_len(values)):
            rows.append({"source": metadata.source, "index": metadata.start + len(rows),
                         "prediction": _row(values, i)})
        outputs.append(values)
    if len(rows) != len(records):
        raise ModelDefError(f"{model_def.path}: the model produced {len(rows)} predictions for "
                            f"{len(records)} records of {metadata.source} [{metadata.start}, {metadata.end})")
    return rows, outputs


def predict_task(model_def: ModelDef, predictor: Predictor, task: pb.Task, *, output: str, batch_size: int,
                 worker_id: str, processor=None, data_origin: str | None = None) -> int:
    """Predict every record of ``task`` and write its part file; returns the rows written
    (``data_origin``: the prediction data string, for a module's custom_data_reader)."""
    records = read_task_records(model_def, task.source, task.start, task.end, mode=Mode.PREDICTION,
                                data_origin=data_origin)
    meta = FeedMetadata(task.source, task.start, task.end, task.epoch)
    rows, outputs = predict_records(model_def, predictor, records, metadata=meta, batch_size=batch_size)
    if is_sql_url(output):  # a table: the task's rows replaced in one transaction
        write_task_rows(output, task.task_id, rows)
    else:
        write_part(output, task.task_id, rows, writer=worker_id)
    if processor is not None and outputs:
        processor.process(_concat(outputs), worker_id)
    return len(rows)
