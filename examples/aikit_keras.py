"""AIkit's TensorFlow use case, run by flextrain: only the import line differs from an AIkit script.

    python examples/aikit_keras.py

(AIkit: ``import aikit.elastic.TF``.) A global batch of 256 with at most 64 samples per device:
one process accumulates 4 micro-batches of 64 per optimizer update.
"""

import json

import numpy as np
import tensorflow as tf

from flextrain.compat import aikit

aikit.elastic.TF.init(256, 64)

rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(1024, 1))).astype("float32")

tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(1)])
model = aikit.elastic.models.Model(model)
model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.05), loss="mse")
history = model.fit(x, y, batch_size=aikit.elastic.batch_size, epochs=3, shuffle=True, verbose=0)

if aikit.elastic.master:
    print(json.dumps({"steps": aikit.elastic.steps, "batch_size": aikit.elastic.batch_size,
                      "global_batch_size": aikit.elastic.global_batch_size, "gpus": aikit.elastic.gpus,
                      "updates": int(model.optimizer.iterations), "losses": history.history["loss"]}))
