"""Mergeable evaluation metrics: metrics that are not a mean of per-sample values.

Most metrics in ``eval_metrics_fn`` are per-sample functions; the master
averages them over every evaluated sample. A metric such as AUC is not a mean
of anything per sample, yet it must come out the same however evaluation tasks
were spread over workers. A :class:`MergeableMetric` therefore keeps an
*additive* state: each worker folds its batches into a fresh instance per task
and reports ``state()``, the master adds the states of all tasks element-wise
and computes the metric once from the total with :func:`result`. Only numpy
here: the master runs it without the model's framework.

Use one in a model-zoo module (PyTorch or Keras)::

    from flextrain.elastic.metrics import AUC

    def eval_metrics_fn():
        return {"accuracy": lambda labels, predictions: ...,  # per sample
                "auc": AUC(from_logits=True)}                  # mergeable

ElasticDL modules that return ``tf.keras.metrics.AUC()`` get the equivalent
:class:`AUC` (see :func:`flextrain.worker.evaluation.as_mergeable`).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np


class MergeableMetric(abc.ABC):
    """A metric with additive state.

    Contract: ``update(labels, predictions)`` folds one batch (numpy arrays,
    first dimension the batch) into the state; ``state()`` is a float64 vector
    whose element-wise sum over disjoint parts of the data equals the state of
    all of it; ``result_of(state)`` computes the metric from such a sum and
    depends only on the vector (its length carries any size parameter), so the
    master needs nothing but ``kind`` to finish it.
    """

    kind: ClassVar[str]

    @abc.abstractmethod
    def update(self, labels: np.ndarray, predictions: np.ndarray) -> None:
        ...

    @abc.abstractmethod
    def state(self) -> np.ndarray:
        ...

    @abc.abstractmethod
    def reset(self) -> None:
        ...

    @staticmethod
    @abc.abstractmethod
    def result_of(state: np.ndarray) -> float:
        ...


class AUC(MergeableMetric):
    """Area under the ROC curve of binary labels (0/1) and scores.

    Scores (probabilities in [0, 1], or logits with ``from_logits=True``) are
    counted into ``num_buckets`` equal-width buckets per label; the area is the
    probability that a random positive scores above a random negative, with
    pairs in one bucket counted as ties (one half). It is exact when no
    positive and negative share a bucket, and otherwise errs by at most the
    fraction of such pairs / 2 (about 1/num_buckets for smooth scores).
    """

    kind = "auc"

    def __init__(self, *, num_buckets: int = 10000, from_logits: bool = False) -> None:
        if num_buckets < 1:
            raise ValueError(f"AUC: num_buckets must be positive, got {num_buckets}")
        self.num_buckets = int(num_buckets)
        self.from_logits = bool(from_logits)
        self.reset()

    def reset(self) -> None:
        self._counts = np.zeros((2, self.num_buckets), dtype=np.float64)  # [negatives, positives]

    def update(self, labels, predictions) -> None:
        labels = np.asarray(labels).reshape(-1)
        scores = np.asarray(predictions, dtype=np.float64).reshape(-1)
        if labels.shape != scores.shape:
            raise ValueError(f"AUC: {labels.size} labels for {scores.size} predictions "
                             f"(one score per sample is expected)")
        if not np.isin(labels, (0, 1)).all():
            raise ValueError(f"AUC: labels must be 0 or 1, got {np.unique(labels)[:5].tolist()}")
        if self.from_logits:
            scores = 0.5 * (1.0 + np.tanh(0.5 * scores))  # the sigmoid, without overflow warnings
        bucket = np.clip((scores * self.num_buckets).astype(np.int64), 0, self.num_buckets - 1)
        positive = labels.astype(bool)
        self._counts[0] += np.bincount(bucket[~positive], minlength=self.num_buckets)
        self._counts[1] += np.bincount(bucket[positive], minlength=self.num_buckets)

    def state(self) -> np.ndarray:
        return self._counts.reshape(-1).copy()

    @staticmethod
    def result_of(state: np.ndarray) -> float:
        negatives, positives = np.asarray(state, dtype=np.float64).reshape(2, -1)
        n_neg, n_pos = negatives.sum(), positives.sum()
        if n_neg == 0 or n_pos == 0:
            return float("nan")  # undefined with one class only
        below = np.cumsum(negatives) - negatives  # negatives in lower buckets
        return float((positives * (below + 0.5 * negatives)).sum() / (n_pos * n_neg))


KINDS: dict[str, type[MergeableMetric]] = {AUC.kind: AUC}


def result(kind: str, state) -> float:
    """The metric ``kind`` of a (summed) state; ValueError for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown mergeable metric kind {kind!r} (known: {sorted(KINDS)})")
    return KINDS[kind].result_of(np.asarray(state, dtype=np.float64))
