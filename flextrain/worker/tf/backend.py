"""KerasBackend: a Keras model under the framework-neutral AllReduce round protocol.

Gradients are computed with ``tf.GradientTape`` inside a ``tf.function``
(the module's model and loss must therefore be traceable, as Keras models
are) and added, scaled,
into numpy views of the trainer's flat float32 torch buffer (shared memory,
no copy), so the very same gloo all-reduce (``flextrain.worker.collective``)
sums Keras and PyTorch gradients alike; no Horovod. Sparse gradients
(``tf.IndexedSlices`` from ``Embedding`` layers) are scattered into their
dense views with ``np.add.at`` (repeated ids add up). After the reduction
:meth:`KerasBackend.apply` hands the buffer's views to the Keras optimizer.

State for broadcast and checkpoints: every model weight (trainable or not)
and every optimizer variable (slots, iteration count, learning rate), as torch
tensors keyed ``"<index>:<variable path>"``; loading matches them by position
and checks count and shapes (auto-generated Keras names may differ between
processes).
"""

from __future__ import annotations

import numpy as np
import torch

from flextrain.worker.backend import ModelBackend
from flextrain.worker.module import ModelDef, ModelDefError
from flextrain.worker.tf.checks import require_tf
from flextrain.worker.tf.feed import feed_dataset, take


def variables_tree(variables) -> dict[str, torch.Tensor]:
    """``{"<i>:<path>": tensor}`` for Keras variables (values copied)."""
    return {f"{i}:{v.path}": torch.from_numpy(np.array(v.numpy())) for i, v in enumerate(variables)}


def assign_tree(variables, tree: dict, *, what: str) -> None:
    """Assign what :func:`variables_tree` returned, matched by position (Keras' auto-generated
    names may differ between processes); ValueError if the count or a shape differs."""
    values = sorted(tree.items(), key=lambda kv: int(kv[0].split(":", 1)[0]))
    if len(values) != len(variables):
        raise ValueError(f"{what} state has {len(values)} variables, this model has {len(variables)}")
    for (key, value), v in zip(values, variables):
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(f"{what} state {key} has shape {tuple(value.shape)}, expected {v.path} {tuple(v.shape)}")
        v.assign(value.numpy())


class KerasBackend(ModelBackend):
    def __init__(self, *, model_def: ModelDef, model, optimizer, extra: int) -> None:
        self.tf = require_tf()
        self.model_def, self.model, self.optimizer = model_def, model, optimizer
        self.variables = list(model.trainable_variables)
        bad = [v.path for v in self.variables if v.dtype != "float32"]
        if bad:
            raise ModelDefError(f"{model_def.path}: trainable weights must be float32, got {bad[:3]}")
        sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.size = sum(sizes)
        self.flat = torch.zeros(self.size + extra, dtype=torch.float32)
        buf = self.flat.numpy()  # shares memory with the torch buffer the collective reduces
        self._views, offset = [], 0
        for v, n in zip(self.variables, sizes):
            self._views.append(buf[offset: offset + n].reshape(tuple(v.shape)))
            offset += n
        # Compiled once per input signature (micro-batch sizes vary: retracing is relaxed to
        # unknown dimensions); eager Keras spends most of a small model's step in Python.
        self._gradients_fn = self.tf.function(self._gradients, reduce_retracing=True)
        self._apply_fn = self.tf.function(self._apply, reduce_retracing=True)

    def feed(self, records, mode, meta):
        return feed_dataset(self.model_def, records, mode, meta)

    def zero(self) -> None:
        self.flat.zero_()

    def _gradients(self, features, labels):
        with self.tf.GradientTape() as tape:
            loss = self.model_def.loss(labels, self.model(features, training=True))
        return loss, tape.gradient(loss, self.variables)

    def _apply(self, grads) -> None:
        self.optimizer.apply_gradients(zip(grads, self.variables))

    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        tf = self.tf
        loss, grads = self._gradients_fn(take(features, index), take(labels, index))
        if getattr(loss, "shape", None) is None or loss.shape.rank != 0:
            raise ModelDefError(f"{self.model_def.path}: loss(labels, predictions) must return the mean over the "
                                f"samples (a scalar tensor), got {type(loss).__name__}{getattr(loss, 'shape', '')}")
        for view, grad in zip(self._views, grads):
            if grad is None:  # a weight this loss does not depend on
                continue
            if isinstance(grad, tf.IndexedSlices):
                np.add.at(view, grad.indices.numpy(), scale * grad.values.numpy())
            else:
                view += scale * grad.numpy()
        return float(loss)

    def apply(self) -> None:
        tf = self.tf
        self._apply_fn([tf.constant(view) for view in self._views])

    def state(self) -> dict:
        return {"model": variables_tree(self.model.weights), "optimizer": variables_tree(self.optimizer.variables)}

    def load_state(self, tree: dict) -> None:
        assign_tree(self.model.weights, tree["model"], what="model")
        assign_tree(self.optimizer.variables, tree["optimizer"], what="optimizer")
        self.zero()
