"""The ElasticDL ``feed(dataset, mode, metadata)`` contract over ``tf.data``.

The worker hands ``feed`` a ``tf.data.Dataset`` of the span's raw records
(``tf.string`` scalars, in order) and expects back a dataset with one element
per record: ``(features, labels)``, or in PREDICTION mode ``features`` alone.
The framework batches it (one batch of the whole span) and slices micro-batches
from the tensors. Evaluation and prediction need the records' order kept
(prediction rows are matched to records by position); shuffling within a
training span is harmless (labels travel with their features). Anything else (not a dataset, not a pair, a dataset that
batches, drops or repeats records) is a :class:`ModelDefError` naming ``feed``
and what it returned: exactly-once accounting needs one element per record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from flextrain.worker.contract import FeedMetadata, Mode, ModelDefError
from flextrain.worker.tf.checks import require_tf

if TYPE_CHECKING:  # the registry (flextrain.worker.frameworks) imports this module; ModelDef is only a type here
    from flextrain.worker.module import ModelDef


_OPTIONS = None


def _options():
    """tf.data options for the per-step pipelines: no autotuning or graph rewrites (they cost more
    than they save on one small batch)."""
    global _OPTIONS
    if _OPTIONS is None:
        tf = require_tf()
        _OPTIONS = tf.data.Options()
        _OPTIONS.autotune.enabled = False
        _OPTIONS.experimental_optimization.apply_default_optimizations = False
    return _OPTIONS


def _describe_spec(spec: Any) -> str:
    tf = require_tf()
    return repr(tf.nest.map_structure(lambda s: f"{s.dtype.name}{s.shape}", spec))


def _rows_dataset(model_def: ModelDef, rows: Sequence[dict]):
    """A table source's rows as a dataset of per-row dicts (column name -> tensor)."""
    tf = require_tf()
    columns = {}
    for name in rows[0]:
        values = [row[name] for row in rows]
        if any(v is None for v in values):
            raise ModelDefError(f"{model_def.path}: column {name!r} holds NULL in the rows given to feed: "
                                "a tf.data.Dataset cannot hold a missing value (fill it in the table, or leave "
                                "the column out of the module's `columns`)")
        columns[name] = values
    return tf.data.Dataset.from_tensor_slices(columns)


def feed_dataset(model_def: ModelDef, records: Sequence[bytes], mode: Mode, meta: FeedMetadata):
    """``(features, labels)`` tensors (nested structures allowed) whose first dimension is ``len(records)``."""
    tf = require_tf()
    dataset = _rows_dataset(model_def, records) if records and isinstance(records[0], dict) else \
        tf.data.Dataset.from_tensor_slices(tf.constant(list(records), dtype=tf.string, shape=[len(records)]))
    name = getattr(model_def.feed, "__name__", "feed")
    usage = f"{name}(dataset, {mode.value!r}, metadata)"
    out = model_def.feed(dataset, mode.value, meta)
    if not isinstance(out, tf.data.Dataset):
        raise ModelDefError(f"{model_def.path}: {usage} must return a tf.data.Dataset of per-record "
                            f"{'features' if mode is Mode.PREDICTION else '(features, labels)'}, "
                            f"got {type(out).__name__}")
    spec = out.element_spec
    if mode is not Mode.PREDICTION and not (isinstance(spec, tuple) and len(spec) == 2):
        raise ModelDefError(f"{model_def.path}: {usage} must return a dataset of (features, labels) pairs, "
                            f"got a dataset of {_describe_spec(spec)}")
    n = len(records)
    try:  # the fast path: one element, no iterator (creating one costs ~10x more per step)
        got = out.batch(max(n, 1)).with_options(_options()).get_single_element()
    except tf.errors.InvalidArgumentError:  # not exactly one batch: too many records, or none
        got = None
    sizes = sorted({int(t.shape[0]) if t.shape.rank else -1 for t in tf.nest.flatten(got)}) if got is not None else []
    if sizes != [n]:
        cap = 2 * n + 2  # a repeating dataset never ends: count only so far
        count = sum(1 for _ in out.take(cap))
        count = f"more than {cap - 1}" if count == cap else count
        raise ModelDefError(f"{model_def.path}: {usage} returned a dataset of {count} elements "
                            f"({_describe_spec(spec)}) for {n} records; it must yield exactly one element per "
                            "record (the framework batches; do not batch, filter or repeat)")
    if mode is Mode.PREDICTION:
        return got, None
    return got


def take(value, index: slice):
    """Rows ``index`` of every tensor in a (nested) structure."""
    tf = require_tf()
    return tf.nest.map_structure(lambda t: t[index], value)
