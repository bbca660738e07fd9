"""KerasPredictor: the framework-neutral ``Predictor`` (``flextrain.worker.evaluation``) for Keras.

``batches`` applies the ElasticDL ``feed`` over ``tf.data`` (checked like in
training) and runs the model with ``training=False`` (dropout and batch-norm
in inference behaviour), no tape, one batch of at most ``batch_size`` records
at a time, in record order. Under the ParameterServer strategy the model's
``Embedding`` layers pull their rows from the PS (``flextrain/worker/ps_keras.py``), so a PS
worker evaluates the PS's current parameters.

``load_checkpoint`` reads a checkpoint written by the Keras AllReduce trainer
(``tf/backend.py``: weights by position, shapes checked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flextrain.worker.evaluation import Predictor
from flextrain.worker.contract import ModelDefError
from flextrain.worker.tf.backend import assign_tree
from flextrain.worker.tf.feed import feed_dataset, take

if TYPE_CHECKING:  # the registry (flextrain.worker.frameworks) imports this module; ModelDef is only a type here
    from flextrain.worker.module import ModelDef


class KerasPredictor(Predictor):
    def __init__(self, model_def: ModelDef, model) -> None:
        self.model_def = model_def
        self.model = model

    def batches(self, records, *, mode, metadata, batch_size):
        features, labels = feed_dataset(self.model_def, records, mode, metadata)
        for lo in range(0, len(records), batch_size):
            sl = slice(lo, min(lo + batch_size, len(records)))
            yield self.model(take(features, sl), training=False), (None if labels is None else take(labels, sl))

    def load_checkpoint(self, path: str) -> None:
        from flextrain.elastic.statecodec import StateCodecError, decode

        try:
            with open(path, "rb") as f:
                tree = decode(f.read())
            assign_tree(self.model.weights, tree["model"], what="model")
        except (OSError, StateCodecError, KeyError, TypeError, ValueError) as exc:
            raise ModelDefError(f"checkpoint {path} does not fit the model of {self.model_def.spec}: "
                                f"{type(exc).__name__}: {exc}") from exc
        self.checkpoint_version = int(tree.get("version", 0))
