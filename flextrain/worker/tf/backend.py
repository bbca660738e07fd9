"""KerasBackend: a Keras model under the framework-neutral AllReduce round protocol.

Gradients are computed with ``tf.GradientTape`` inside a ``tf.function``
(the module's model and loss must therefore be traceable, as Keras models
are) and added, scaled, into numpy views of the per-dtype flat torch buffers
(``flextrain.worker.backend.gradient_buffers``; shared memory, no copy), so
the very same gloo all-reduce (``flextrain.worker.collective``) sums Keras
and PyTorch gradients alike; no Horovod. Trainable weights may be float32,
float64, bfloat16 or float16, mixed (a layer's ``dtype=``); bfloat16 views are
``ml_dtypes.bfloat16`` arrays, TensorFlow's own numpy bfloat16. Sparse gradients
(``tf.IndexedSlices`` from ``Embedding`` layers) are scattered into their
dense views with ``np.add.at`` (repeated ids add up). After the reduction
:meth:`KerasBackend.apply` hands the buffer's views to the Keras optimizer.

State for broadcast and checkpoints: every model weight (trainable or not)
and every optimizer variable (slots, iteration count, learning rate), as torch
tensors keyed ``"<index>:<variable path>"``; loading matches them by position
and checks count and shapes (auto-generated Keras names may differ between
processes).

LR rules (a job's ``--lr-rule``) set the optimizer's ``learning_rate`` to
``factor`` times the one it was built with; a ``LearningRateSchedule`` cannot
be scaled so and is refused naming it. ``--lr-rule adascale`` measures
Σ nᵢ‖gᵢ‖² from each micro-batch's gradients, which this backend holds
anyway before adding them up (in float64; sparse rows summed first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from flextrain.worker.backend import FLOAT_DTYPES, ModelBackend, gradient_buffers
from flextrain.worker.contract import ModelDefError
from flextrain.worker.tf.checks import require_tf
from flextrain.worker.tf.feed import feed_dataset, take

if TYPE_CHECKING:  # the registry (flextrain.worker.frameworks) imports this module; ModelDef is only a type here
    from flextrain.worker.module import ModelDef


def to_torch(array: np.ndarray, *, copy: bool = True) -> torch.Tensor:
    """A torch tensor of a numpy array (a copy, or sharing its memory with ``copy=False``),
    ``ml_dtypes.bfloat16`` included (torch has no numpy bfloat16)."""
    # np.asarray(order="C"), not np.ascontiguousarray: the latter makes a 0-d array 1-d
    array = np.array(array) if copy else np.asarray(array, order="C")
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU torch tensor; bfloat16 as ``ml_dtypes.bfloat16`` (what TensorFlow takes)."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes  # a TensorFlow dependency

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def variables_tree(variables) -> dict[str, torch.Tensor]:
    """``{"<i>:<path>": tensor}`` for Keras variables (values copied, dtypes kept)."""
    return {f"{i}:{v.path}": to_torch(v.numpy()) for i, v in enumerate(variables)}


def assign_tree(variables, tree: dict, *, what: str) -> None:
    """Assign what :func:`variables_tree` returned, matched by position (Keras' auto-generated
    names may differ between processes); ValueError if the count or a shape differs."""
    values = sorted(tree.items(), key=lambda kv: int(kv[0].split(":", 1)[0]))
    if len(values) != len(variables):
        raise ValueError(f"{what} state has {len(values)} variables, this model has {len(variables)}")
    for (key, value), v in zip(values, variables):
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(f"{what} state {key} has shape {tuple(value.shape)}, expected {v.path} {tuple(v.shape)}")
        v.assign(to_numpy(value))


class KerasBackend(ModelBackend):
    def __init__(self, *, model_def: ModelDef, model, optimizer, extra: int) -> None:
        self.tf = require_tf()
        self.model_def, self.model, self.optimizer = model_def, model, optimizer
        self.variables = list(model.trainable_variables)
        dtypes = [getattr(torch, self.tf.as_dtype(v.dtype).name, None) for v in self.variables]
        bad = [f"{v.path} ({v.dtype})" for v, d in zip(self.variables, dtypes) if d not in FLOAT_DTYPES]
        if bad:
            raise ModelDefError(f"{model_def.path}: trainable weights must be float32, float64, bfloat16 or "
                                f"float16, got {bad[:3]}")
        sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.size = sum(sizes)
        self.buffers, views, self.slots = gradient_buffers(list(zip(dtypes, sizes)), extra)
        # numpy views share memory with the torch buffers the collective reduces
        self._views = [to_numpy(view).reshape(tuple(v.shape)) for v, view in zip(self.variables, views)]
        # Compiled once per input signature (micro-batch sizes vary: retracing is relaxed to
        # unknown dimensions); eager Keras spends most of a small model's step in Python.
        self._gradients_fn = self.tf.function(self._gradients, reduce_retracing=True)
        self._apply_fn = self.tf.function(self._apply, reduce_retracing=True)
        self._base_lr = _constant_lr(optimizer)  # what the LR rules scale (None: a schedule)

    def feed(self, records, mode, meta):
        return feed_dataset(self.model_def, records, mode, meta)

    def prepare(self, sample) -> None:
        """Trace both step functions ahead, without running them: the gradients' for inputs shaped
        like the sample's with the batch dimension unknown (every micro-batch size then calls that
        one trace, where each new size would retrace: a newcomer's first step, a round of another
        size, a task's short last step), the update's for the trainable variables."""
        tf = self.tf
        features, labels = sample()

        def relaxed(value):
            if isinstance(value, tf.Tensor) and value.shape.rank:
                return tf.TensorSpec([None, *value.shape[1:]], value.dtype)
            return tf.type_spec_from_value(value)  # sparse, ragged, a scalar: as it is

        self._gradients_fn.get_concrete_function(tf.nest.map_structure(relaxed, features),
                                                 tf.nest.map_structure(relaxed, labels))
        self._apply_fn.get_concrete_function([tf.TensorSpec(view.shape, view.dtype) for view in self._views])

    def traces(self) -> int:
        return (self._gradients_fn.experimental_get_tracing_count()
                + self._apply_fn.experimental_get_tracing_count())

    def zero(self) -> None:
        for buffer in self.buffers:
            buffer.zero_()
        if self.micro_sqr is not None:
            self.micro_sqr.zero_()

    def scale_lr(self, factor: float) -> list[float]:
        if self._base_lr is None:
            raise ModelDefError(
                f"{self.model_def.path}: --lr-rule scales the optimizer's learning rate, but optimizer(...) "
                f"returned a {type(self.optimizer).__name__} whose learning_rate is a schedule "
                f"({type(self.optimizer._learning_rate).__name__}); give it a number, or use --lr-rule none")
        self.optimizer.learning_rate = self._base_lr * factor
        return [float(self.optimizer.learning_rate)]

    def measure_micro_batches(self) -> None:
        if self.micro_sqr is None:
            self.micro_sqr = torch.zeros((), dtype=torch.float64)

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
        sqr = 0.0  # ‖g‖² of this micro-batch's mean-loss gradient (adascale only)
        for view, grad in zip(self._views, grads):
            if grad is None:  # a weight this loss does not depend on
                continue
            if isinstance(grad, tf.IndexedSlices):
                np.add.at(view, grad.indices.numpy(), scale * grad.values.numpy())
                if self.micro_sqr is not None:  # repeated ids add up before the norm
                    rows = tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(view)[0])
                    sqr += _sqr(rows.numpy())
            else:
                dense = grad.numpy()
                view += scale * dense
                if self.micro_sqr is not None:
                    sqr += _sqr(dense)
        if self.micro_sqr is not None:
            self.micro_sqr += (index.stop - index.start) * sqr
        return float(loss)

    def apply(self) -> None:
        tf = self.tf
        self._apply_fn([tf.constant(view) for view in self._views])

    def state(self) -> dict:
        return {"model": variables_tree(self.model.weights), "optimizer": variables_tree(self.optimizer.variables)}

    def load_state(self, tree: dict) -> None:
        assign_tree(self.model.weights, tree["model"], what="model")
        built = None
        if self.keep_lr:
            try:
                built = float(self.optimizer.learning_rate)
            except (TypeError, ValueError):  # a schedule: it is a function of the restored step count
                pass
        assign_tree(self.optimizer.variables, tree["optimizer"], what="optimizer")
        if built is not None:
            self.optimizer.learning_rate = built
        self.zero()


def _constant_lr(optimizer) -> float | None:
    """The optimizer's learning rate as a number; None when it is a schedule (a function of the step:
    Keras evaluates it when ``learning_rate`` is read, so the number read would be the current one)."""
    if callable(getattr(optimizer, "_learning_rate", None)):  # a LearningRateSchedule or a callable
        return None
    try:
        return float(optimizer.learning_rate)
    except (TypeError, ValueError):
        return None


def _sqr(array: np.ndarray) -> float:
    flat = np.asarray(array, dtype=np.float64).ravel()
    return float(np.dot(flat, flat))
