"""Importing TensorFlow, and checking what a TensorFlow module's callables return."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable

from flextrain.worker.contract import TF_INSTALL_HINT, ModelDefError, raised, returned


def require_tf() -> ModuleType:
    """``tensorflow``, with its log noise down and threads limited; ModelDefError if absent."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise ModelDefError(f"this job's module needs TensorFlow, which is not installed; "
                            f"install it with: {TF_INSTALL_HINT}") from exc
    threads = int(os.environ.get("FLEXTRAIN_NUM_THREADS", "0"))
    if threads > 0:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # already initialised: the settings can only be made once
            pass
    return tf


def check_keras_model(model: Any, *, where: str):
    """``model`` if it is a Keras model with its weights created; ModelDefError otherwise.

    ``where`` names the module and the callable (``path.py: the model callable Name()``)."""
    tf = require_tf()
    if not isinstance(model, tf.keras.Model):
        raise ModelDefError(f"{where} returned {returned(model)}, "
                            "expected a tf.keras.Model (this is a TensorFlow module)")
    if not model.trainable_variables:
        raise ModelDefError(
            f"{where} returned a Keras model with no trainable weights (yet); give it an input shape "
            "(keras.Input / a functional or Sequential model with input_shape) or call model.build(...) "
            "in the model callable, so every worker creates the same weights before training")
    return model


def build_keras_optimizer(factory: Callable, model, kwargs: dict, *, where: str):
    """The module's ``optimizer(lr=...)``, built for ``model``'s variables (its slots exist up front)."""
    tf = require_tf()
    call = f"optimizer({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    try:
        opt = factory(**kwargs)
    except Exception as exc:
        raise ModelDefError(f"{where}: {call} raised {raised(exc)}") from exc
    if not isinstance(opt, tf.keras.optimizers.Optimizer):
        raise ModelDefError(f"{where}: {call} returned {returned(opt)}, "
                            "expected a tf.keras optimizer (e.g. return tf.keras.optimizers.SGD(learning_rate=lr))")
    opt.build(model.trainable_variables)
    return opt


def seed_tf(seed: int) -> None:
    """Seed Python, numpy and TensorFlow, so every worker builds the same initial Keras weights."""
    require_tf().keras.utils.set_random_seed(seed)
