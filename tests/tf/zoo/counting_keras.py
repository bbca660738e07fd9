"""A Keras model for ParameterServer tests that counts, on the PS, every time a record is applied,
in the dtype its model callable names (``float64_model``, ``bfloat16_model``, ``float32_model``).

Records are ids as text (``b"17"``). Two counters with one slot per id: ``seen`` (a dense
weight) and an ``Embedding`` (a PS table). The loss is ``-(marks).sum() / n`` with
zero-valued marks, so with SGD at ``lr = n`` (the minibatch size) the PS adds exactly 1
per application (exact in bfloat16 for counts up to 256).
"""

import tensorflow as tf

RECORDS = 64


class Counting(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rows = tf.keras.layers.Embedding(RECORDS, 1, embeddings_initializer="zeros", dtype=self.dtype_policy)

    def build(self, input_shape):
        self.seen = self.add_weight(name="seen", shape=(RECORDS,), initializer="zeros")
        self.rows.build(input_shape)

    def call(self, ids):
        marked = tf.gather(self.seen, ids)
        rows = tf.reshape(self.rows(ids), [-1])
        return (marked - tf.stop_gradient(marked)) + (rows - tf.stop_gradient(rows))


def _model(dtype):
    ids = tf.keras.Input(shape=(), dtype="int64", name="id")
    return tf.keras.Model(ids, Counting(dtype=dtype)(ids))


def float32_model():
    return _model("float32")


def float64_model():
    return _model("float64")


def bfloat16_model():
    return _model("bfloat16")


def loss(labels, predictions):
    return -tf.reduce_sum(predictions) / tf.cast(tf.size(predictions), predictions.dtype)


def optimizer(lr=1.0):
    return tf.keras.optimizers.SGD(learning_rate=lr)


def feed(dataset, mode, _):
    return dataset.map(lambda record: (tf.strings.to_number(record, tf.int64), tf.constant(0, tf.int64)))
