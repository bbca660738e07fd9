"""Keras under AllReduce: real master and worker processes, TF gradients summed by the gloo collective.

The model-zoo module is ``model_zoo/digits_keras.py``, written in the ElasticDL
contract (``custom_model``, ``dataset_fn`` over tf.data parsing tf.train.Example
records, ``optimizer(lr=...)``, the elasticdl ``Mode`` import) and named in the
ElasticDL spelling; it runs unchanged.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ft_helpers import MODEL_ZOO, REPO, read_status, run_flextrain
from flextrain.data import read_records
from flextrain.data.example import decode_example
from flextrain.elastic.statecodec import decode

pytestmark = pytest.mark.e2e

ELASTICDL_SPELLING = "model_zoo.digits_keras.custom_model"
TRAIN_RECORDS = 1438


@pytest.fixture(scope="module")
def trained_job(digits_examples, tmp_path_factory):
    """The ElasticDL digits module trained by two workers (shared by the tests that read its results)."""
    job_dir = tmp_path_factory.mktemp("keras-digits") / "job"
    proc = run_flextrain(
        "train", "--model-def", ELASTICDL_SPELLING, "--training-data", str(digits_examples / "train"),
        "--validation-data", str(digits_examples / "validation"), "--workers", "2", "--epochs", "6",
        "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1", "--job-dir", str(job_dir),
        cwd=REPO, timeout=400,
    )
    return job_dir, proc


def test_elasticdl_keras_module_trains_unchanged_on_two_workers_above_90_percent(trained_job):
    job_dir, proc = trained_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 6 * TRAIN_RECORDS
    assert status["metrics"]["accuracy"] > 0.90, status["metrics"]
    assert 0 < status["metrics"]["loss"] < 1.0
    assert status["step"] == 6 * -(-TRAIN_RECORDS // 64)
    rounds = status["roundHistory"]
    assert len(rounds[0]["members"]) == 2  # both workers trained in the same round


def _reference_run(train_dir, *, seed, global_batch, epochs, lr):
    """A single-process Keras loop over the same records with the same global batch and seed."""
    import tensorflow as tf

    from flextrain.worker.module import load_model_def

    zoo = load_model_def(f"{MODEL_ZOO / 'digits_keras.py'}:custom_model").module  # resolves the elasticdl import
    tf.keras.utils.set_random_seed(seed)
    model = zoo.custom_model()
    initial = [w.numpy() for w in model.weights]
    opt = zoo.optimizer(lr=lr)
    records = [r for f in sorted(train_dir.glob("*.rio")) for r in read_records(f)]
    for _ in range(epochs):
        for lo in range(0, len(records), global_batch):
            batch = records[lo: lo + global_batch]
            x, y = next(iter(zoo.dataset_fn(tf.data.Dataset.from_tensor_slices(batch), "training", None)
                             .batch(len(batch))))
            with tf.GradientTape() as tape:
                loss = zoo.loss(y, model(x, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return initial, [w.numpy() for w in model.weights]


def test_distributed_keras_step_equals_single_process_step(digits_examples, tmp_path):
    """Two workers, uneven micro-batches with accumulation, gloo sum = one process with batch G."""
    job_dir = tmp_path / "job"
    # G=50 over 2 workers with M=16: k=2, four micro-batches of 13/13/12/12 per step.
    proc = run_flextrain(
        "train", "--model-def", f"{MODEL_ZOO / 'digits_keras.py'}:custom_model",
        "--training-data", str(digits_examples / "train"), "--workers", "2", "--epochs", "1",
        "--global-batch-size", "50", "--max-micro-batch", "16", "--lr", "0.05", "--seed", "7",
        "--job-dir", str(job_dir), timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())
    assert final["version"] == -(-TRAIN_RECORDS // 50)
    got = [t.numpy() for _, t in sorted(final["model"].items(), key=lambda kv: int(kv[0].split(":")[0]))]
    initial, expected = _reference_run(digits_examples / "train", seed=7, global_batch=50, epochs=1, lr=0.05)
    assert len(got) == len(expected) == 4  # two Dense layers: kernel and bias each
    for g, e, i in zip(got, expected, initial):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
        assert np.abs(e - i).max() > 1e-3  # training moved every weight: the comparison is not vacuous


def test_keras_checkpoint_predicts_one_row_per_record(trained_job, digits_examples, tmp_path):
    job_dir, proc = trained_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "predictions"
    pred = run_flextrain("predict", "--model-def", ELASTICDL_SPELLING, "--checkpoint", str(job_dir),
                         "--prediction-data", str(digits_examples / "validation"), "--output", str(out),
                         "--workers", "1", "--job-dir", str(tmp_path / "predict-job"), cwd=REPO, timeout=300)
    assert pred.returncode == 0, pred.stderr[-3000:]
    rows = [json.loads(line) for part in sorted(out.glob("part-*.jsonl")) for line in part.read_text().splitlines()]
    records = read_records(digits_examples / "validation" / "digits-00000.rio")
    assert [r["index"] for r in rows] == list(range(len(records)))  # one row per record, in order
    labels = [int(decode_example(r)["label"][0]) for r in records]
    hits = sum(int(np.argmax(r["prediction"])) == y for r, y in zip(rows, labels))
    # the checkpoint's predictions agree with the job's own evaluation of the same model
    assert hits / len(rows) == pytest.approx(read_status(job_dir)["metrics"]["accuracy"], abs=1e-9)
