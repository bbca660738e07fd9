"""Elastic batches for Keras 3 scripts: ``init(G, M)``, a gradient-accumulating ``Model`` and ``Optimizer``.

The Keras half of AIkit's ``aikit.elastic.TF`` (``init(256, 64)``,
``Model(model)``)::

    import flextrain.elastic.keras as elastic
    elastic.init(256, 64)                 # G=256, at most 64 samples per device
    model = elastic.Model(model)          # accumulates elastic.steps micro-batches per update
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, epochs=3)             # batched with elastic.batch_size

One optimizer update then equals one step on the whole global batch of ``G``
samples (the mean loss over ``G``), whatever the world: ``init`` plans it
with :class:`flextrain.elastic.session.Session` over
:func:`flextrain.elastic.world.keras_world` (``WORLD_SIZE``/``RANK``, else
the current ``tf.distribute`` strategy's replicas).

Accumulation is Keras' own (``gradient_accumulation_steps`` of Keras 3
optimizers: the mean of ``steps`` micro-gradients, applied with clipping,
weight decay and optimizer state advancing once per update;
``optimizer.iterations`` counts updates). This module sets it on the
optimizer before the optimizer is built, and adds what Keras lacks:

* uneven splits (``G`` not divisible by the world's micro-batches):
  ``Model`` weights each micro-batch's loss by its actual size
  (``n * world_size * steps / G``, so that Keras' mean over ``steps`` becomes
  the sum over samples divided by ``G``), and ``fit`` on arrays batches with
  the plan's ``batch_sizes`` rather than one fixed size; the custom-loop
  ``Optimizer`` weights positionally with ``loss_weights`` (feed it batches
  of ``batch_sizes``);
* refusals instead of silent differences or deep failures: a ``steps`` or
  ``batch_size`` that disagrees with the plan, an optimizer already built
  without accumulation, learning-rate schedules (Keras evaluates them at
  micro-step counts, which a single-step run never sees), and accumulation
  under a multi-replica ``tf.distribute`` strategy (Keras' accumulation fails
  there).

Cross-process gradient averaging (several processes under ``WORLD_SIZE``) is
the distribution strategy's job, not this module's: it plans, batches and
accumulates for this process.
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from flextrain.elastic import progress
from flextrain.elastic import session as _sessions
from flextrain.elastic.session import ElasticInitError, Session
from flextrain.elastic.world import keras_world

keras = tf.keras  # Keras 3 under TF 2.16+, as flextrain.worker.tf uses it

# What init publishes (None before the first init), AIkit's names plus ours.
steps: int | None = None
batch_size: int | None = None
batch_sizes: tuple[int, ...] | None = None
device_batch_size: int | None = None
global_batch_size: int | None = None
gpus: int | None = None  # AIkit's name for world_size
world_size: int | None = None
rank: int | None = None
master: bool | None = None
loss_weights: tuple[float, ...] | None = None
session: Session | None = None


def init(global_batch_size: Any, max_gpu_batch_size: Any = None, *, max_micro_batch: Any = None) -> Session:
    """Plan ``global_batch_size`` (G) samples per optimizer update over this script's world, with at
    most ``max_gpu_batch_size`` (AIkit's positional name) or ``max_micro_batch`` (M; give exactly
    one) samples per device. Sets this module's attributes (``steps``, ``batch_size``, ...), makes
    the plan the process's current one (:func:`flextrain.elastic.session.activate`) and returns it.
    Calling it again (e.g. after the world changed) plans afresh; models and optimizers wrapped
    before keep the plan they were wrapped with."""
    limit = _sessions.max_micro_batch_of(max_gpu_batch_size, max_micro_batch)
    planned = Session.plan_for(global_batch_size, limit, keras_world())
    globals().update(planned.attributes())
    return _sessions.activate(planned)


def _bind(steps_arg: Any, who: str) -> tuple[int, Session | None]:
    """The accumulation steps ``who`` uses: init's plan (``steps_arg`` must then agree), or
    ``steps_arg`` alone (plain accumulation, no elastic plan) when init has not run."""
    if steps_arg is not None and (isinstance(steps_arg, bool) or not isinstance(steps_arg, int) or steps_arg < 1):
        raise ElasticInitError(f"{who}: steps must be a positive integer, got {steps_arg!r}")
    if session is None:
        if steps_arg is None:
            raise ElasticInitError(f"{who}: call flextrain.elastic.keras.init(global_batch_size, "
                                   "max_gpu_batch_size) first, or pass steps")
        return steps_arg, None
    if steps_arg is not None and steps_arg != session.steps:
        raise ElasticInitError(f"{who}: steps={steps_arg} disagrees with init's plan of {session.steps} "
                               f"accumulation step(s) ({session.describe()}); leave steps out")
    return session.steps, session


def _accumulating(optimizer: Any, steps_: int, *, who: str) -> Any:
    """``optimizer`` (a Keras optimizer, its name, or an :class:`Optimizer`) set to accumulate
    ``steps_`` micro-gradients per update. The optimizer object itself is changed (so a script's
    reference to it stays the one in use); it must not be built yet unless it already accumulates
    ``steps_``."""
    if isinstance(optimizer, Optimizer):
        if optimizer.steps != steps_:
            raise ElasticInitError(f"{who}: the Optimizer accumulates {optimizer.steps} step(s), "
                                   f"the model {steps_}")
        return optimizer.optimizer
    optimizer = keras.optimizers.get(optimizer)
    have = optimizer.gradient_accumulation_steps or 1
    if have == steps_:
        return optimizer
    if have != 1:
        raise ElasticInitError(f"{who}: the optimizer's gradient_accumulation_steps={have} disagrees with "
                               f"steps={steps_}; leave gradient_accumulation_steps unset")
    replicas = int(tf.distribute.get_strategy().num_replicas_in_sync)
    if replicas > 1:
        # Keras 3.15's accumulation (TF backend) all-reduces inside ops.cond, which
        # tf.distribute refuses ("merge_call called while defining a new graph").
        raise ElasticInitError(f"{who}: accumulating {steps_} steps under a tf.distribute strategy of "
                               f"{replicas} replicas is not supported (Keras' gradient accumulation fails "
                               "there); use a larger max_gpu_batch_size so steps is 1, or one replica")
    if optimizer.built:
        raise ElasticInitError(f"{who}: the optimizer was already used (built) without accumulation; "
                               "pass a fresh one, it gets its accumulators when it is built")
    # Keras evaluates a schedule at the raw micro-step count (documented under
    # gradient_accumulation_steps), so it would decay `steps` times too fast. (A plain callable
    # gets no step; one reading optimizer.iterations sees updates, which is right.)
    if isinstance(getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule):
        raise ElasticInitError(f"{who}: learning-rate schedules are not supported with accumulation "
                               f"(steps={steps_}): Keras would evaluate them per micro-batch")
    optimizer.gradient_accumulation_steps = steps_  # what __init__ stores; build() adds the accumulators
    return optimizer


def _is_array_input(x: Any) -> bool:
    """Input that ``fit`` batches itself (arrays, tensors, lists/dicts of them), as opposed to a
    dataset or generator that brings its own batches."""
    return not (x is None or isinstance(x, (tf.data.Dataset, keras.utils.PyDataset))
                or inspect.isgenerator(x) or hasattr(x, "__next__"))


class Model(keras.Model):
    """``model`` training with ``steps`` accumulated micro-batches per optimizer update.

    ``steps`` defaults to init's plan (a different value is an error); without init, ``steps``
    alone gives plain accumulation. ``compile`` sets the optimizer to accumulate (see the module
    docstring); ``fit`` batches arrays with init's ``batch_size`` (``batch_sizes`` for uneven
    plans) and refuses another ``batch_size``; datasets must bring the plan's batches themselves.
    For one update per ``G`` samples, give ``fit`` whole global batches per epoch (Keras'
    accumulation counts micro-batches across epochs).

    Forward passes, ``predict`` and ``evaluate`` are the wrapped model's; ``save``,
    ``save_weights`` and ``load_weights`` act on the wrapped model itself (compiled with the same
    optimizer, so its state is saved), so a saved file loads with plain Keras as the original model.
    """

    def __init__(self, model: Any, steps: int | None = None, **kwargs: Any) -> None:
        if not isinstance(model, keras.Model):
            raise TypeError(f"Model wraps a keras.Model, got {type(model).__name__}")
        accumulate, plan = _bind(steps, "Model")
        super().__init__(name=kwargs.pop("name", model.name), **kwargs)
        self.inner = model
        self.accumulation_steps = accumulate
        self.elastic_session = plan
        if model.built:
            self.built = True

    def call(self, inputs: Any, training: Any = None) -> Any:
        return self.inner(inputs, training=training)

    def compile(self, optimizer: Any = "rmsprop", *args: Any, **kwargs: Any) -> None:
        with self.distribute_strategy.scope():  # the strategy fit will run under
            optimizer = _accumulating(optimizer, self.accumulation_steps, who="Model.compile")
        super().compile(optimizer, *args, **kwargs)
        # The original, compiled with the same optimizer object, is what save() writes.
        self.inner.compile(optimizer, *args, **kwargs)

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        plan = self.elastic_session
        if not training or plan is None or plan.even:
            return loss
        # Keras averages `steps` micro-gradients; weighting this micro-batch's mean loss by
        # n * world_size * steps / G makes the update sum(loss over samples) / G, for any batching
        # whose `steps` consecutive micro-batches hold this process's share of G.
        n = tf.shape(tf.nest.flatten(y_pred)[0])[0]
        factor = tf.cast(n, loss.dtype) * (plan.world_size * plan.steps / plan.global_batch_size)
        # The gradient scaled, the reported loss not (stop_gradient carries the difference).
        return loss * factor + tf.stop_gradient(loss * (1 - factor))

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, *args: Any, **kwargs: Any) -> Any:
        if progress.active():  # inside a script job: each update goes into the job's history
            if getattr(self, "_flextrain_progress", None) is None:  # one for every fit: the count goes on
                object.__setattr__(self, "_flextrain_progress", _Progress(self.accumulation_steps))
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or ()), self._flextrain_progress]
        plan = self.elastic_session
        if plan is None or not _is_array_input(x):
            return super().fit(x, y, batch_size, *args, **kwargs)
        if batch_size is not None and batch_size != plan.batch_size:
            raise ElasticInitError(f"Model.fit: batch_size={batch_size} disagrees with init's plan "
                                   f"(batch_size {plan.batch_size}: {plan.describe()}); leave batch_size out")
        if plan.even:
            return super().fit(x, y, plan.batch_size, *args, **kwargs)
        batches = self._uneven_batches(x, y, kwargs)
        return super().fit(batches, None, None, *args, shuffle=False, **kwargs)

    def _uneven_batches(self, x: Any, y: Any, kwargs: dict[str, Any]) -> tf.data.Dataset:
        """Arrays as a dataset of the plan's micro-batches (``batch_sizes``, cycled per update);
        takes ``sample_weight`` and ``shuffle`` out of ``kwargs``, as ``fit`` would have used them."""
        if kwargs.get("validation_split"):
            raise ElasticInitError("Model.fit: validation_split is not supported with an uneven plan "
                                   f"({self.elastic_session.describe()}); pass validation_data")
        sample_weight = kwargs.pop("sample_weight", None)
        shuffle = kwargs.pop("shuffle", True)
        parts = tuple(part for part in (x, y, sample_weight) if part is not None)
        data = tf.data.Dataset.from_tensor_slices(parts)
        if shuffle:
            data = data.shuffle(int(data.cardinality()), reshuffle_each_iteration=True)
        plan, count = self.elastic_session, int(data.cardinality())
        share = sum(plan.batch_sizes)
        batches = data.batch(share).rebatch(list(plan.batch_sizes))
        # rebatch hides the length; fit needs it for progress and to end epochs without a warning.
        full, rest = divmod(count, share)
        tail = 0
        for size in plan.batch_sizes:
            if rest <= 0:
                break
            tail, rest = tail + 1, rest - size
        return batches.apply(tf.data.experimental.assert_cardinality(full * len(plan.batch_sizes) + tail))

    def save(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.save(*args, **kwargs)

    def save_weights(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.save_weights(*args, **kwargs)

    def load_weights(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.load_weights(*args, **kwargs)


class _Progress(keras.callbacks.Callback):
    """``fit``'s batches reported into a script job's history (flextrain.elastic.progress): one record per
    update (every ``steps`` micro-batches), with the mean of their losses. Runs eagerly, between batches;
    one per model, so that the count goes on across ``fit`` calls (one per epoch, say)."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps, self.batches, self.losses = max(1, steps), 0, []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches += 1
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if self.batches % self.steps == 0:
            progress.report(step=progress.restored_step() + self.batches // self.steps,
                            loss=sum(self.losses) / len(self.losses) if self.losses else None)
            self.losses = []


class Optimizer:
    """A Keras optimizer for custom training loops that applies one update every ``steps`` calls.

    ``apply_gradients(zip(grads, variables))`` is called once per micro-batch with that
    micro-batch's gradient of its mean loss; every ``steps``-th call applies the mean of the
    accumulated gradients (weighted by init's ``loss_weights`` for uneven plans, so feed batches
    of ``batch_sizes`` in order) and returns True (a bool tensor), the others return False. The
    last result is also :attr:`applied`. ``steps`` defaults to init's plan (a different value is
    an error). Everything else (``iterations``: updates applied, ``learning_rate``, ``variables``)
    is the wrapped optimizer's, which is set to accumulate and must not be built yet.
    """

    def __init__(self, optimizer: Any, steps: int | None = None) -> None:
        self.steps, self.session = _bind(steps, "Optimizer")
        self.optimizer = _accumulating(optimizer, self.steps, who="Optimizer")
        self.applied: Any = None
        plan = self.session
        # Keras averages micro-gradients; uneven plans need weight_j * steps on micro-step j.
        self._factors = None if plan is None or plan.even else [w * self.steps for w in plan.loss_weights]

    def apply_gradients(self, grads_and_vars: Any) -> Any:
        pairs = list(grads_and_vars)
        if self._factors is not None:
            # Keras' raw call counter (`iterations` divides it by steps): the micro-step index.
            micro = self.optimizer._iterations % self.steps
            factor = tf.gather(tf.constant(self._factors, tf.float64), micro)
            pairs = [(_scaled(g, factor), v) for g, v in pairs]
        self.optimizer.apply_gradients(pairs)
        self.applied = tf.equal(self.optimizer._iterations % self.steps, 0)
        return self.applied

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":  # not set yet (failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)


def _scaled(gradient: Any, factor: Any) -> Any:
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):  # embedding rows
        return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype), gradient.indices,
                                gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


__all__ = ["ElasticInitError", "Model", "Optimizer", "init"]
