"""Evaluation on the worker: the framework-neutral ``Predictor`` and metric sums.

A :class:`Predictor` runs the user's model over raw records in inference
mode; everything above it (evaluation tasks, prediction output) is
framework-neutral. ``flextrain.worker.pytorch.TorchPredictor`` and
``flextrain.worker.tf.evaluation.KerasPredictor`` implement it; the registry
(:func:`flextrain.worker.frameworks.make_predictor`) picks one.

Metrics: ``eval_metrics_fn()`` maps names to ``fn(labels, predictions)``
returning per-sample values; a worker reports, per metric, the sum of those
values (float64) and the number of samples, and the master divides the
totals: the metric is the mean over every evaluated sample however the tasks
were spread over workers. A mergeable metric (AUC, :mod:`flextrain.elastic.metrics`)
reports its additive state instead, which the master adds up.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

import numpy as np

from flextrain.elastic.metrics import MergeableMetric
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.contract import FeedMetadata, Mode, ModelDefError
from flextrain.worker.reading import read_task_records

if TYPE_CHECKING:  # the implementations import this module; ModelDef is only a type here
    from flextrain.worker.module import ModelDef


class EvalSums(NamedTuple):
    """What one evaluation task reports: see :func:`metric_sums`."""

    sums: dict[str, float]
    samples: int
    states: dict[str, tuple[str, np.ndarray]]  # name -> (kind, additive state)


class Predictor(abc.ABC):
    """Runs a model-zoo model over raw records without training it.

    Contract (every framework implements exactly this):

    ``batches(records, mode=, metadata=, batch_size=)``
        ``feed`` the raw ``records`` (a list of ``bytes``) for ``mode``
        (``Mode.EVALUATION`` or ``Mode.PREDICTION``) and run the model in
        inference mode (no gradients, dropout/batch-norm in eval behaviour).
        Yields ``(predictions, labels)`` per batch of at most ``batch_size``
        consecutive records, in record order, covering every record once.
        ``predictions`` is the model's output for the batch and ``labels``
        the labels ``feed`` returned for the same records (``None`` in
        PREDICTION mode). Both are framework-native (torch tensors, TF
        tensors, or a dict/tuple of them) whose first dimension is the batch
        size; ``eval_metrics_fn``'s functions receive them unchanged, and
        :func:`to_numpy` turns them into numpy for output.
        A ``feed`` that returns the wrong structure raises ``ModelDefError``
        naming ``feed`` and what it returned.

    ``load_checkpoint(path)``
        Load the model weights from a flextrain checkpoint file written by
        this framework's trainer (``checkpoints/*.ckpt``). Raises
        ``ModelDefError`` naming the file when it does not fit the model.

    ``checkpoint_version``
        The model version (optimizer steps) of the last checkpoint loaded,
        0 before any.
    """

    checkpoint_version: int = 0

    @abc.abstractmethod
    def batches(self, records: list[bytes], *, mode: Mode, metadata: FeedMetadata,
                batch_size: int) -> Iterator[tuple[Any, Any]]:
        ...

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None:
        ...


def to_numpy(value: Any) -> Any:
    """A framework-native tensor (or dict/tuple/list of them) as numpy arrays."""
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(to_numpy(v) for v in value)
    if hasattr(value, "detach"):  # torch
        return value.detach().cpu().numpy()
    if hasattr(value, "numpy"):  # tf eager tensors
        return np.asarray(value.numpy())
    return np.asarray(value)


def metric_sums(model_def: ModelDef, predictor: Predictor, records: list[bytes], *,
                metadata: FeedMetadata, batch_size: int) -> EvalSums:
    """Per-metric sums of per-sample values over ``records``, the sample count, and the
    states of the mergeable metrics (:mod:`flextrain.elastic.metrics`)."""
    metrics = model_def.metric_fns()  # none: the samples are still counted
    sums = {name: 0.0 for name, fn in metrics.items() if not isinstance(fn, MergeableMetric)}
    seen = 0
    for predictions, labels in predictor.batches(records, mode=Mode.EVALUATION, metadata=metadata,
                                                 batch_size=batch_size):
        n = batch_len(predictions)
        for name, fn in metrics.items():
            if isinstance(fn, MergeableMetric):
                try:
                    fn.update(to_numpy(labels), to_numpy(predictions))
                except ValueError as exc:
                    raise ModelDefError(f"{model_def.path}: metric {name!r}: {exc}") from exc
                continue
            values = np.asarray(to_numpy(fn(labels, predictions)), dtype=np.float64)
            if values.size != n:
                raise ModelDefError(
                    f"{model_def.path}: metric {name!r} returned {values.size} value{'s' if values.size != 1 else ''} "
                    f"for {n} samples; it must return one value per sample"
                )
            sums[name] += float(values.sum())
        seen += n
    if seen != len(records):
        raise ModelDefError(f"{model_def.path}: the model produced {seen} predictions for "
                            f"{len(records)} records")
    states = {name: (fn.kind, fn.state()) for name, fn in metrics.items() if isinstance(fn, MergeableMetric)}
    return EvalSums(sums, seen, states)


def evaluate_task(model_def: ModelDef, predictor: Predictor, task: pb.Task, *,
                  batch_size: int, data_origin: str | None = None) -> EvalSums:
    """Read an evaluation task's records and return its metric sums and sample count
    (``data_origin``: the validation data string, for a module's custom_data_reader)."""
    records = read_task_records(model_def, task.source, task.start, task.end, mode=Mode.EVALUATION,
                                data_origin=data_origin)
    meta = FeedMetadata(task.source, task.start, task.end, task.epoch)
    return metric_sums(model_def, predictor, records, metadata=meta, batch_size=batch_size)


def batch_len(value: Any) -> int:
    """The first dimension of a batch (of its first tensor, for a dict/tuple)."""
    if isinstance(value, dict):
        value = next(iter(value.values()))
    elif isinstance(value, (tuple, list)):
        value = value[0]
    return int(value.shape[0])
