"""A Keras digits classifier written exactly in the ElasticDL model-zoo contract.

Runs unchanged on ElasticDL and on flextrain. Data: ``flextrain data digits
--out DIR --format example`` (each record a serialized ``tf.train.Example``
with ``image``: 64 floats, pixel values 0..16, and ``label``: one int64).

    flextrain train --model-def model_zoo.digits_keras.custom_model \\
        --training-data DIR/train --validation-data DIR/validation --workers 2 ...

The contract, as in ElasticDL:

``custom_model()``      returns a ``tf.keras.Model`` (named by ``--model-def``).
``loss(labels, predictions)``  the mean loss over the samples given.
``optimizer(lr=...)``   returns a Keras optimizer; ``--lr`` overrides the default.
``dataset_fn(dataset, mode, metadata)``  maps a ``tf.data.Dataset`` of raw
    records to one ``(features, labels)`` per record (PREDICTION: features);
    the framework batches. ``feed`` is the newer name of the same function.
``eval_metrics_fn()``   ``{name: fn(labels, predictions)}``, per-sample values.
"""

import tensorflow as tf
from elasticdl.python.common.constants import Mode


def custom_model():
    inputs = tf.keras.Input(shape=(64,), name="image")
    x = tf.keras.layers.Dense(64, activation="relu")(inputs)
    outputs = tf.keras.layers.Dense(10)(x)
    return tf.keras.Model(inputs=inputs, outputs=outputs, name="digits_keras")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        input_tensor=tf.nn.sparse_softmax_cross_entropy_with_logits(logits=predictions, labels=labels)
    )


def optimizer(lr=0.1):
    return tf.keras.optimizers.SGD(learning_rate=lr, momentum=0.9)


def dataset_fn(dataset, mode, _):
    def _parse_data(record):
        if mode == Mode.PREDICTION:
            feature_description = {"image": tf.io.FixedLenFeature([64], tf.float32)}
        else:
            feature_description = {
                "image": tf.io.FixedLenFeature([64], tf.float32),
                "label": tf.io.FixedLenFeature([1], tf.int64),
            }
        r = tf.io.parse_single_example(record, feature_description)
        features = tf.math.divide(tf.cast(r["image"], tf.float32), 16.0)
        if mode == Mode.PREDICTION:
            return features
        return features, tf.cast(r["label"], tf.int32)

    dataset = dataset.map(_parse_data)
    if mode == Mode.TRAINING:
        dataset = dataset.shuffle(buffer_size=1024)
    return dataset


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: tf.equal(
            tf.argmax(predictions, 1, output_type=tf.int32), tf.cast(tf.reshape(labels, [-1]), tf.int32)
        )
    }
