"""Keras under the ParameterServer strategy: the optimizer mapping, the exact PS update of one
minibatch against a local Keras computation (in-process PS on loopback), and a 2 PS x 2 worker job."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ft_helpers import MODEL_ZOO, FakeMaster, read_status, run_flextrain
from flextrain.data import read_records
from flextrain.data.ctr import CTR_FIELDS, write_ctr
from flextrain.job import JobSpec, Strategy
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.module import FeedMetadata, Mode, ModelDefError, load_model_def
from flextrain.worker.trainer import WorkerState

tf = pytest.importorskip("tensorflow")

from flextrain.worker.tf.feed import feed_dataset  # noqa: E402
from flextrain.worker.ps_keras import KerasPSTrainer, keras_optimizer_config  # noqa: E402

DEEPFM_KERAS = f"{MODEL_ZOO / 'deepfm_keras.py'}:custom_model"


def test_keras_optimizers_map_to_the_ps_optimizers():
    opts = tf.keras.optimizers
    assert keras_optimizer_config(opts.SGD(learning_rate=0.1)) == ("sgd", {"lr": pytest.approx(0.1)})
    name, hyper = keras_optimizer_config(opts.SGD(learning_rate=0.1, momentum=0.9, nesterov=True))
    assert name == "sgd" and hyper["momentum"] == pytest.approx(0.9) and hyper["nesterov"] == 1.0
    name, hyper = keras_optimizer_config(opts.Adam(learning_rate=0.01, beta_1=0.8))
    assert name == "adam" and hyper["beta1"] == pytest.approx(0.8) and hyper["eps"] == pytest.approx(1e-7)
    assert keras_optimizer_config(opts.AdamW(learning_rate=0.01, weight_decay=0.1))[0] == "adamw"
    assert keras_optimizer_config(opts.Adagrad(learning_rate=0.01))[0] == "adagrad"
    with pytest.raises(ValueError, match="cannot run the Keras optimizer RMSprop; it runs tf.keras.optimizers.SGD"):
        keras_optimizer_config(opts.RMSprop())
    with pytest.raises(ValueError, match="weight decay"):
        keras_optimizer_config(opts.SGD(weight_decay=0.01))
    with pytest.raises(ValueError, match="clipnorm"):
        keras_optimizer_config(opts.SGD(clipnorm=1.0))


def test_one_minibatch_updates_the_ps_exactly_like_local_keras_sgd(two_ps, tmp_path):
    """Dense pull, row pull for the batch's distinct ids, micro-batches 24/24/16, dense + merged sparse push."""
    write_ctr(tmp_path / "data", rows=200, seed=3)
    source = str(tmp_path / "data" / "train" / "ctr-00000.rio")
    lr, n = 0.5, 64
    spec = JobSpec.of(name="j", model_def=DEEPFM_KERAS, training_data=source, job_dir=str(tmp_path),
                   strategy=Strategy.PARAMETER_SERVER, ps=2, global_batch_size=n, max_micro_batch=24,
                   learning_rate=lr).validate()
    # plain SGD instead of the module's Adam: the update has a closed form
    md = dataclasses.replace(load_model_def(DEEPFM_KERAS),
                             optimizer=lambda lr=0.01: tf.keras.optimizers.SGD(learning_rate=lr))
    tf.keras.utils.set_random_seed(0)
    model = md.build_model()
    master = FakeMaster([pb.Task(task_id=0, kind=pb.Task.TRAINING, source=source, start=0, end=n,
                                 global_batch_size=n)])
    trainer = KerasPSTrainer(spec=spec, model_def=md, model=model, optimizer=md.build_optimizer(model, lr),
                             client=master, state=WorkerState(), ps_addresses=two_ps)
    try:
        assert set(trainer.tables) == {f"embedding_{f}" for f in range(CTR_FIELDS)} | \
            {f"linear_{f}" for f in range(CTR_FIELDS)}
        assert trainer.tables["linear_0"][1] == "zeros" and trainer.tables["embedding_0"][1] == "normal"
        trainer.setup()
        records = read_records(source)[:n]
        features, labels = feed_dataset(md, records, Mode.TRAINING, FeedMetadata(source, 0, n, 0))
        ids = features["ids"].numpy()
        # the PS's parameters before the step: dense, and the rows this batch uses (created on first pull)
        _, dense_before = trainer.ps.pull_dense(None)
        rows_before = {f"{kind}_{f}": trainer.ps.pull_embedding(f"{kind}_{f}", np.unique(ids[:, f])).numpy()
                       for kind in ("embedding", "linear") for f in range(CTR_FIELDS)}
        # the same computation in plain Keras: a fresh model holding those values, one full-batch gradient
        ref = md.build_model()
        for v in ref.trainable_variables:
            layer = v.path.split("/")[0]
            if layer in rows_before:
                full = np.zeros(tuple(v.shape), np.float32)
                full[np.unique(ids[:, int(layer.rsplit("_", 1)[1])])] = rows_before[layer]
                v.assign(full)
            else:
                v.assign(dense_before[v.path].numpy())
        with tf.GradientTape() as tape:
            loss = md.loss(labels, ref(features, training=True))
        grads = dict(zip([v.path for v in ref.trainable_variables], tape.gradient(loss, ref.trainable_variables)))

        assert trainer.train() is True
        assert master.reports == [(0, {"ok": True})]
        _, dense_after = trainer.ps.pull_dense(None)
        assert set(dense_after) == {v.path for v in ref.trainable_variables} - {f"{t}/embeddings" for t in rows_before}
        for name, after in dense_after.items():
            expected = dense_before[name].numpy() - lr * tf.convert_to_tensor(grads[name]).numpy()
            np.testing.assert_allclose(after.numpy(), expected, rtol=1e-4, atol=1e-6, err_msg=name)
            np.testing.assert_array_equal(trainer.variables[name].numpy(), after.numpy())  # pulled into Keras
        for table, before in rows_before.items():
            f = int(table.rsplit("_", 1)[1])
            distinct = np.unique(ids[:, f])
            g = tf.convert_to_tensor(grads[f"{table}/embeddings"]).numpy()[distinct]
            after = trainer.ps.pull_embedding(table, distinct).numpy()
            np.testing.assert_allclose(after, before - lr * g, rtol=1e-4, atol=1e-6, err_msg=table)
        assert any(np.abs(g).max() > 0 for g in tf.nest.flatten(grads))
    finally:
        trainer.close()


def test_unsupported_keras_optimizer_is_named_when_the_worker_starts(two_ps, tmp_path):
    md = dataclasses.replace(load_model_def(DEEPFM_KERAS),
                             optimizer=lambda lr=0.01: tf.keras.optimizers.RMSprop(learning_rate=lr))
    model = md.build_model()
    spec = JobSpec.of(name="j", model_def=DEEPFM_KERAS, training_data=str(tmp_path), job_dir=str(tmp_path),
                   strategy=Strategy.PARAMETER_SERVER, ps=2)
    with pytest.raises(ModelDefError, match="deepfm_keras.py: the parameter server cannot run the Keras optimizer "
                                            "RMSprop"):
        KerasPSTrainer(spec=spec, model_def=md, model=model, optimizer=md.build_optimizer(model, None),
                       client=FakeMaster([]), state=WorkerState(), ps_addresses=two_ps)


def test_keras_optimizer_the_ps_cannot_run_is_refused_at_submission(tmp_path):
    module = tmp_path / "rms_keras.py"
    module.write_text((MODEL_ZOO / "deepfm_keras.py").read_text() +
                      "\n\ndef optimizer(lr=0.01):\n    return tf.keras.optimizers.RMSprop(learning_rate=lr)\n")
    write_ctr(tmp_path / "data", rows=100)
    proc = run_flextrain("train", "--model-def", f"{module}:custom_model", "--training-data",
                         str(tmp_path / "data" / "train"), "--distribution-strategy", "ParameterServer", "--ps", "1",
                         "--job-dir", str(tmp_path / "job"), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "rms_keras.py: `optimizer` returns RMSprop, which --distribution-strategy ParameterServer cannot use" \
        in proc.stderr
    assert "tf.keras.optimizers.SGD" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.e2e
def test_keras_deepfm_trains_on_two_ps_and_two_workers(tmp_path):
    proc = run_flextrain("data", "ctr", "--out", str(tmp_path / "ctr"), "--rows", "10000", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    job_dir = tmp_path / "job"
    proc = run_flextrain(
        "train", "--model-def", DEEPFM_KERAS, "--training-data", str(tmp_path / "ctr" / "train"),
        "--validation-data", str(tmp_path / "ctr" / "validation"), "--distribution-strategy", "ParameterServer",
        "--ps", "2", "--workers", "2", "--global-batch-size", "128", "--epochs", "2", "--lr", "0.02",
        "--job-dir", str(job_dir), "--relaunch-budget", "0", "--min-workers-timeout", "30", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 2 * 8000
    # Majority class (no click) is ~0.70 and its log loss (the entropy of a 30 % click rate) ~0.61:
    # the model must beat both clearly, which needs the embeddings (the labels depend on the ids).
    assert status["metrics"]["accuracy"] > 0.74, status["metrics"]
    assert status["metrics"]["logloss"] < 0.55, status["metrics"]
    assert status["metrics"]["auc"] > 0.75, status["metrics"]  # tf.keras.metrics.AUC; 0.5 is chance
    logs = sorted(p.name for p in (job_dir / "logs").glob("*.log"))
    assert logs == ["ps-0.log", "ps-1.log", "worker-0.log", "worker-1.log"]
    for name in ("worker-0.log", "worker-1.log"):  # both workers trained (pushed) without dying
        assert "Traceback" not in (job_dir / "logs" / name).read_text()
