"""A DeepFM-style click-through-rate model in Keras (ElasticDL contract), for the ParameterServer strategy.

Data: ``flextrain data ctr --out DIR`` (see ``flextrain.data.ctr``): per record
``CTR_FIELDS`` int64 categorical ids, ``CTR_DENSE`` float32 dense features and a
uint8 click label, little-endian, ``CTR_RECORD_BYTES`` bytes. ``feed`` parses
them with ``tf.io.decode_raw`` inside ``tf.data``.

Model: one ``tf.keras.layers.Embedding`` per field (dim ``EMBED_DIM``) plus a
1-wide embedding per field for the first-order term; FM second-order
interactions over the field embeddings; a small MLP over the concatenated
embeddings and dense features; one logit per sample.

With ``--distribution-strategy ParameterServer`` every ``Embedding`` becomes a
PS table (only the rows a batch uses are pulled; their gradients are pushed,
merged per id); the other weights are dense PS parameters. The module also
runs under AllReduce.
"""

import tensorflow as tf
from elasticdl.python.common.constants import Mode

from flextrain.data.ctr import CTR_DENSE, CTR_FIELDS, CTR_RECORD_BYTES, CTR_VOCAB

EMBED_DIM = 8


def custom_model(hidden=32):
    ids = tf.keras.Input(shape=(CTR_FIELDS,), dtype="int64", name="ids")
    dense = tf.keras.Input(shape=(CTR_DENSE,), dtype="float32", name="dense")
    init = tf.keras.initializers.RandomNormal(stddev=0.05)
    fields = [tf.keras.layers.Embedding(v, EMBED_DIM, embeddings_initializer=init, name=f"embedding_{f}")(ids[:, f])
              for f, v in enumerate(CTR_VOCAB)]
    linear = [tf.keras.layers.Embedding(v, 1, embeddings_initializer="zeros", name=f"linear_{f}")(ids[:, f])
              for f, v in enumerate(CTR_VOCAB)]
    emb = tf.keras.layers.Lambda(lambda xs: tf.stack(xs, axis=1))(fields)  # [n, F, D]
    first = tf.keras.layers.Add()([*linear, tf.keras.layers.Dense(1, name="dense_linear")(dense)])  # [n, 1]
    fm = tf.keras.layers.Lambda(lambda e: 0.5 * tf.reduce_sum(
        tf.square(tf.reduce_sum(e, axis=1)) - tf.reduce_sum(tf.square(e), axis=1), axis=1, keepdims=True))(emb)
    deep = tf.keras.layers.Dense(hidden, activation="relu", name="mlp_hidden")(
        tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(emb), dense]))
    deep = tf.keras.layers.Dense(1, name="mlp_out")(deep)
    logit = tf.keras.layers.Add()([first, fm, deep])
    return tf.keras.Model(inputs={"ids": ids, "dense": dense}, outputs=tf.keras.layers.Flatten()(logit),
                          name="deepfm_keras")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.reshape(predictions, [-1])))


def optimizer(lr=0.01):
    return tf.keras.optimizers.Adam(learning_rate=lr)


def feed(dataset, mode, metadata):
    def parse(record):
        record = tf.ensure_shape(record, [])
        ids = tf.io.decode_raw(tf.strings.substr(record, 0, CTR_FIELDS * 8), tf.int64)
        dense = tf.io.decode_raw(tf.strings.substr(record, CTR_FIELDS * 8, CTR_DENSE * 4), tf.float32)
        features = {"ids": tf.reshape(ids, [CTR_FIELDS]), "dense": tf.reshape(dense, [CTR_DENSE])}
        if mode == Mode.PREDICTION:
            return features
        label = tf.io.decode_raw(tf.strings.substr(record, CTR_RECORD_BYTES - 1, 1), tf.uint8)
        return features, tf.cast(tf.reshape(label, [1]), tf.int64)

    return dataset.map(parse)


def eval_metrics_fn():
    def accuracy(labels, predictions):
        return tf.cast(tf.equal(tf.cast(tf.reshape(predictions, [-1]) > 0, tf.int64), tf.reshape(labels, [-1])),
                       tf.float32)

    def logloss(labels, predictions):
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(tf.reshape(labels, [-1]), tf.float32),
                                                       logits=tf.reshape(predictions, [-1]))

    # ElasticDL style: a Keras AUC object, which flextrain computes with its own mergeable AUC.
    return {"accuracy": accuracy, "logloss": logloss, "auc": tf.keras.metrics.AUC(from_logits=True)}
