"""Model-zoo module for bench/spares.py ``--framework keras``: the Keras digits model with a
step-recording optimizer, the Keras twin of ``zoo_digits.py``.

The model, loss and ``dataset_fn`` of ``model_zoo/digits_keras.py`` (SGD with momentum); every
committed optimizer step appends ``"<time.time()> <n>"`` to
``$RESCALE_DIR/steps-$FLEXTRAIN_WORKER_ID.txt``. flextrain applies the gradients inside a
``tf.function``, so the stamp is a ``tf.py_function`` traced after the update: TensorFlow's automatic
control dependencies run stateful ops in program order, so it runs after each update is applied, and
flextrain applies only the steps whose all-reduce succeeded. Without both environment variables (the
master, preflight) nothing is recorded.
"""

import os
import time
from pathlib import Path

import tensorflow as tf

from flextrain.job.usermodule import import_module_of

_DIR = os.environ.get("RESCALE_DIR")
_WORKER = os.environ.get("FLEXTRAIN_WORKER_ID")


# The zoo's module loaded as flextrain loads any --model-def (its `elasticdl` import included)
_zoo, _ = import_module_of(f"{Path(__file__).resolve().parents[2] / 'model_zoo' / 'digits_keras.py'}:custom_model")
custom_model, loss, dataset_fn = _zoo.custom_model, _zoo.loss, _zoo.dataset_fn


class StepRecordingSGD(tf.keras.optimizers.SGD):
    """Keras SGD with momentum that logs the wall-clock time of every update it applies."""

    def __init__(self, learning_rate=0.1, momentum=0.9, **kwargs):
        super().__init__(learning_rate=learning_rate, momentum=momentum, **kwargs)
        self._steps = 0
        self._log = open(os.path.join(_DIR, f"steps-{_WORKER}.txt"), "a", buffering=1) if _DIR and _WORKER else None

    def _stamp(self):
        self._steps += 1
        self._log.write(f"{time.time():.6f} {self._steps}\n")
        return 0

    def apply_gradients(self, grads_and_vars):
        out = super().apply_gradients(grads_and_vars)
        if self._log is not None:
            tf.py_function(self._stamp, [], tf.int32)
        return out


def optimizer(lr=0.1):
    return StepRecordingSGD(learning_rate=lr, momentum=0.9)
