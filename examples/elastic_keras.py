"""The seed's TensorFlow use case with flextrain.elastic.keras: a global batch of 256 on whatever world
the script finds, at most 64 samples per device, gradient accumulation making up the rest.

    python examples/elastic_keras.py                    # one process: 4 accumulation steps of 64
    WORLD_SIZE=2 RANK=0 python examples/elastic_keras.py   # plans 2 steps of 64 for this process

Prints the plan, the loss of each epoch, the final loss and the number of optimizer updates
(one per 256 samples).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import flextrain.elastic.keras as elastic

keras = tf.keras


def main(epochs: int = 3, samples: int = 1024) -> None:
    session = elastic.init(256, 64)  # AIkit: aikit.elastic.TF.init(256, 64)
    print("plan:", session.describe())

    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(samples, 1))).astype("float32")

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model = elastic.Model(model)  # AIkit: aikit.elastic.models.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="mse")
    # batch_size is left out: fit uses elastic.batch_size, the micro-batch.
    history = model.fit(x, y, epochs=epochs, shuffle=True, verbose=0)
    for epoch, loss in enumerate(history.history["loss"], 1):
        print(f"epoch {epoch}: loss {loss:.4f}")
    print(f"final loss {history.history['loss'][-1]:.4f}")
    print(f"optimizer updates {int(model.optimizer.iterations)} "
          f"({elastic.steps} micro-batches of {elastic.batch_size} each)")


if __name__ == "__main__":
    main()
