"""The Keras twin of tests/evaluation/zoo/stepcount.py (ElasticDL contract): CSV records ``x,label``.

One weight ``b`` (0 at start); the output for a record is ``[x, b]``; the
loss is the mean of ``b``, so every SGD update at lr 1 lowers ``b`` by
exactly 1: the model of version ``v`` has ``b == -v``. Metrics: ``step``
(``-b``: the version evaluated), ``x`` and ``accuracy`` (``x % 3 == label``).
"""

import tensorflow as tf


class StepCount(tf.keras.layers.Layer):
    def build(self, input_shape):
        self.b = self.add_weight(name="b", shape=(), initializer="zeros")

    def call(self, x):
        return tf.stack([x, x * 0.0 + self.b], axis=1)


def custom_model():
    inputs = tf.keras.Input(shape=(), name="x")
    return tf.keras.Model(inputs=inputs, outputs=StepCount()(inputs), name="stepcount_keras")


def loss(labels, predictions):
    return tf.reduce_mean(predictions[:, 1])


def optimizer(lr=1.0):
    return tf.keras.optimizers.SGD(learning_rate=lr)


def feed(dataset, mode, _):
    def parse(record):
        parts = tf.strings.split(tf.strings.strip(record), ",")
        x = tf.strings.to_number(parts[0], tf.float32)
        if mode == "prediction":
            return x
        return x, tf.strings.to_number(parts[1], tf.int64)

    return dataset.map(parse)


def eval_metrics_fn():
    return {
        "step": lambda labels, predictions: -predictions[:, 1],
        "x": lambda labels, predictions: predictions[:, 0],
        "accuracy": lambda labels, predictions: tf.cast(
            tf.equal(tf.cast(predictions[:, 0], tf.int64) % 3, tf.cast(tf.reshape(labels, [-1]), tf.int64)),
            tf.float32),
    }
