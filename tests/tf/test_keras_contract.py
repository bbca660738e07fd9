"""The TensorFlow half of the module contract: detection, ElasticDL spelling, feed checks, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ft_helpers import MODEL_ZOO, REPO
from flextrain.data.example import encode_example
from flextrain.worker.module import FeedMetadata, Framework, Mode, ModelDefError, load_model_def

tf = pytest.importorskip("tensorflow")

from flextrain.worker.frameworks import make_backend  # noqa: E402  (after TF is known to be there)
from flextrain.worker.tf.feed import feed_dataset  # noqa: E402

META = FeedMetadata("mem", 0, 4, 0)
RECORDS = [encode_example({"image": np.full(64, i, np.float32), "label": [i]}) for i in range(4)]

KERAS_MODULE = """
import tensorflow as tf

def custom_model():
    inputs = tf.keras.Input(shape=(2,))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))

def loss(labels, predictions):
    return tf.reduce_mean(tf.square(predictions - labels))

def optimizer(lr=0.1):
    return tf.keras.optimizers.SGD(learning_rate=lr)

def feed(dataset, mode, metadata):
    return dataset.map(lambda r: (tf.ones([2]), tf.zeros([1])))
"""


def keras_module(tmp_path, name: str, replace: dict[str, str] | None = None) -> str:
    text = textwrap.dedent(KERAS_MODULE)
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return f"{path}:custom_model"


def test_elasticdl_module_loads_unchanged_in_dotted_spelling(monkeypatch):
    monkeypatch.chdir(REPO)
    md = load_model_def("model_zoo.digits_keras.custom_model")
    assert md.framework is Framework.TENSORFLOW
    assert md.feed is md.module.dataset_fn  # the older name, accepted as the alias of feed
    assert md.module.Mode is Mode  # `from elasticdl.python.common.constants import Mode` resolved to ours
    model = md.build_model()
    assert isinstance(model, tf.keras.Model)
    opt = md.build_optimizer(model, 0.05)
    assert isinstance(opt, tf.keras.optimizers.SGD) and float(opt.learning_rate) == pytest.approx(0.05)
    features, labels = feed_dataset(md, RECORDS, Mode.TRAINING, META)
    assert features.shape == (4, 64) and labels.shape == (4, 1)
    # training mode shuffles within the span; every record is there once
    assert sorted(labels.numpy().ravel().tolist()) == [0, 1, 2, 3]
    assert sorted((features.numpy()[:, 0] * 16).round().tolist()) == [0, 1, 2, 3]
    features, labels = feed_dataset(md, RECORDS, Mode.PREDICTION, META)
    assert labels is None and features.shape == (4, 64)


def test_torch_modules_stay_torch():
    assert load_model_def(f"{MODEL_ZOO / 'digits_torch.py'}:Model").framework is Framework.PYTORCH


@pytest.mark.parametrize("feed_body, expected", [
    ("return dataset.map(lambda r: (r, r, r))",
     r"feed\(dataset, 'training', metadata\) must return a dataset of \(features, labels\) pairs, "
     r"got a dataset of \('string\(\)', 'string\(\)', 'string\(\)'\)"),
    ("return [1, 2]", r"feed\(dataset, 'training', metadata\) must return a tf.data.Dataset .*got list"),
    ("return dataset.map(lambda r: (tf.ones([2]), tf.zeros([1]))).batch(2)",
     r"returned a dataset of 2 elements .* for 4 records; it must yield exactly one element per record"),
    ("return dataset.map(lambda r: (tf.ones([2]), tf.zeros([1]))).take(3)",
     r"returned a dataset of 3 elements"),
    ("return dataset.map(lambda r: (tf.ones([2]), tf.zeros([1]))).repeat()",
     r"returned a dataset of more than 9 elements"),
])
def test_feed_returning_the_wrong_structure_is_named(tmp_path, feed_body, expected):
    spec = keras_module(tmp_path, f"badfeed{abs(hash(feed_body)) % 10000}",
                        {"return dataset.map(lambda r: (tf.ones([2]), tf.zeros([1])))": feed_body})
    md = load_model_def(spec)
    with pytest.raises(ModelDefError, match=expected) as info:
        feed_dataset(md, RECORDS, Mode.TRAINING, META)
    assert md.path in str(info.value)


def test_torch_style_optimizer_in_a_tf_module_is_rejected_at_load(tmp_path):
    spec = keras_module(tmp_path, "torchopt", {"def optimizer(lr=0.1):": "def optimizer(params, lr=0.1):"})
    with pytest.raises(ModelDefError, match=r"`optimizer` has the wrong signature .*expected optimizer\(lr=...\) "
                                            r"\(TensorFlow module\)"):
        load_model_def(spec)


def test_model_that_is_not_keras_is_rejected(tmp_path):
    spec = keras_module(tmp_path, "notkeras", {"    inputs = tf.keras.Input(shape=(2,))\n": "",
                                               "return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))":
                                               "return object()"})
    with pytest.raises(ModelDefError, match="returned object, expected a tf.keras.Model"):
        load_model_def(spec).build_model()


def test_per_sample_loss_is_rejected(tmp_path):
    spec = keras_module(tmp_path, "persample", {"tf.reduce_mean(tf.square(predictions - labels))":
                                                "tf.square(predictions - labels)"})
    md = load_model_def(spec)
    model = md.build_model()
    backend = make_backend(model_def=md, model=model, optimizer=md.build_optimizer(model, None), extra=0)
    features, labels = backend.feed(RECORDS, Mode.TRAINING, META)
    with pytest.raises(ModelDefError, match=r"loss\(labels, predictions\) must return the mean .*\(4, 1\)"):
        backend.accumulate(features, labels, slice(0, 4), scale=1.0)


# A sitecustomize on PYTHONPATH: every process of the job (the CLI, its zygote, preflight) is in an
# environment where the tensorflow extra is not installed
_BLOCK_TF = """
import sys
class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorflow', 'keras'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoTensorFlow())
"""


def test_tf_module_without_tensorflow_says_how_to_install_before_any_process_starts(tmp_path):
    from flextrain.data.example import write_digits_examples

    write_digits_examples(tmp_path / "data")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCK_TF)
    job_dir = tmp_path / "job"
    pythonpath = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", "flextrain", "train", "--model-def", str(MODEL_ZOO / "digits_keras.py") + ":custom_model",
         "--training-data", str(tmp_path / "data" / "train"), "--job-dir", str(job_dir)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": pythonpath})
    assert proc.returncode == 2, proc.stderr
    assert "digits_keras.py is a TensorFlow module but TensorFlow is not installed" in proc.stderr
    assert "pip install 'flextrain[tensorflow]'" in proc.stderr
    assert not job_dir.exists()  # nothing was started


@pytest.mark.e2e
def test_job_with_a_feed_of_the_wrong_structure_fails_naming_feed(digits_examples, tmp_path):
    from ft_helpers import read_status, run_flextrain

    spec = keras_module(tmp_path, "pairless", {"return dataset.map(lambda r: (tf.ones([2]), tf.zeros([1])))":
                                               "return dataset.map(lambda r: tf.ones([2]))"})
    job_dir = tmp_path / "job"
    # --no-preflight: the worker's own check is under test (preflight would refuse the job at submission)
    proc = run_flextrain("train", "--model-def", spec, "--training-data", str(digits_examples / "train"),
                         "--workers", "1", "--epochs", "1", "--global-batch-size", "64", "--max-task-retries", "1",
                         "--job-dir", str(job_dir), "--no-preflight", timeout=300)
    assert proc.returncode == 4, proc.stderr[-3000:]  # ExitCode.MODULE_CONTRACT: failed at once, no retries
    status = read_status(job_dir)
    assert status["phase"] == "Failed" and status["failure"]["kind"] == "ModuleContract"
    assert "pairless.py: feed(dataset, 'training', metadata) must return a dataset of (features, labels) pairs, " \
           "got a dataset of 'float32(2,)'" in status["message"], status["message"]
    assert status["progress"]["recordsDone"] == 0  # nothing was applied


def test_auto_micro_batch_refuses_a_keras_module():
    """--max-micro-batch auto probes a PyTorch step; the CLI, preflight and the worker refuse a Keras module."""
    from flextrain.job import JobSpec
    from flextrain.worker.probing import check_framework

    module = f"{MODEL_ZOO / 'digits_keras.py'}:custom_model"
    spec = JobSpec.of(name="k", model_def=module, training_data="d", job_dir="/j", max_micro_batch="auto").validate()
    with pytest.raises(ModelDefError, match="--max-micro-batch auto measures PyTorch training steps; .*digits_keras.py "
                                            "is a tensorflow module"):
        check_framework(spec, load_model_def(module))
    check_framework(spec.replace(max_micro_batch=16), load_model_def(module))  # a number: nothing to probe


def test_accelerate_refuses_a_keras_module(capsys, tmp_path, digits_data):
    """--accelerate applies PyTorch strategies: flextrain train exits 2 naming the Keras module, before any
    process starts (the worker refuses it too: flextrain.worker.accelerating.check_framework)."""
    from flextrain.cli import main

    module = MODEL_ZOO / "digits_keras.py"
    code = main(["train", "--model-def", f"{module}:custom_model", "--training-data", str(digits_data / "train"),
                 "--job-dir", str(tmp_path / "job"), "--accelerate", "amp_native:bf16", "--no-preflight"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--accelerate applies training strategies to PyTorch models; {module} is a tensorflow module" in err
    assert not (tmp_path / "job").exists()


def test_table_rows_reach_a_keras_feed_as_a_dataset_of_row_dicts(tmp_path):
    """Parquet and SQL sources give row dicts: the dataset's elements are dicts of column tensors."""
    md = load_model_def(keras_module(tmp_path, "rows", {
        "return dataset.map(lambda r: (tf.ones([2]), tf.zeros([1])))":
            "return dataset.map(lambda r: (tf.stack([r['a'], r['b']]), tf.cast([r['y']], tf.float32)))"}))
    rows = [{"a": float(i), "b": 2.0 * i, "y": i} for i in range(4)]
    features, labels = feed_dataset(md, rows, Mode.TRAINING, META)
    got = sorted(zip(features.numpy().tolist(), labels.numpy().ravel().tolist()), key=lambda p: p[1])
    assert got == [([float(i), 2.0 * i], float(i)) for i in range(4)]
    with pytest.raises(ModelDefError, match=r"column 'b' holds NULL in the rows given to feed"):
        feed_dataset(md, [{"a": 1.0, "b": None, "y": 0}], Mode.TRAINING, META)
