"""Mergeable metrics (AUC): exact against scikit-learn, additive over tasks, summed by the master."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from flextrain.elastic import metrics
from flextrain.elastic.metrics import AUC
from flextrain.job import JobType
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.module import ModelDefError, load_model_def

from test_master_evaluations import eval_task, make_master, report


def scores_and_labels(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    return rng.normal(labels * 0.8, 1.0), labels  # positives score higher on average


def test_auc_equals_scikit_learn_when_buckets_separate_the_scores():
    logits, labels = scores_and_labels()
    auc = AUC(num_buckets=1 << 22, from_logits=True)  # finer than any gap between these sigmoid scores
    for lo in range(0, len(labels), 700):  # batch by batch
        auc.update(labels[lo: lo + 700], logits[lo: lo + 700])
    assert AUC.result_of(auc.state()) == pytest.approx(roc_auc_score(labels, logits), abs=1e-9)


def test_auc_with_the_default_buckets_is_within_a_thousandth_and_counts_ties_as_half():
    logits, labels = scores_and_labels(seed=1)
    auc = AUC(from_logits=True)
    auc.update(labels, logits)
    assert AUC.result_of(auc.state()) == pytest.approx(roc_auc_score(labels, logits), abs=1e-3)
    tied = AUC()
    tied.update([0, 1, 0, 1], [0.5, 0.5, 0.1, 0.9])  # pairs: (0.5 vs 0.5) tie, the rest ordered
    assert AUC.result_of(tied.state()) == roc_auc_score([0, 1, 0, 1], [0.5, 0.5, 0.1, 0.9]) == 0.875


def test_states_of_parts_add_up_to_the_state_of_the_whole():
    probs, labels = scores_and_labels(seed=2)
    probs = 1 / (1 + np.exp(-probs))
    whole, parts = AUC(), [AUC(), AUC(), AUC()]
    whole.update(labels, probs)
    for i, part in enumerate(parts):
        part.update(labels[i::3], probs[i::3])
    total = sum(p.state() for p in parts)
    assert np.array_equal(total, whole.state())
    assert metrics.result("auc", total) == AUC.result_of(whole.state())


def test_bad_input_is_named():
    auc = AUC()
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        auc.update([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="3 labels for 6 predictions"):
        auc.update([0, 1, 1], np.zeros((3, 2)))
    with pytest.raises(ValueError, match="unknown mergeable metric kind 'f1'"):
        metrics.result("f1", [1.0])
    assert np.isnan(AUC.result_of(AUC().state()))  # one class only: undefined


def test_master_sums_states_over_tasks_and_reports_the_auc(tmp_path):
    master = make_master(tmp_path, eval_records=30, job_type=JobType.EVALUATION)
    a, b = eval_task(master, "A", 3).task, eval_task(master, "B", 3).task
    logits, labels = scores_and_labels(n=30, seed=3)
    state = {}
    for task, wid in ((a, "A"), (b, "B")):
        part = AUC(num_buckets=1 << 20, from_logits=True)
        part.update(labels[task.start: task.end], logits[task.start: task.end])
        state[wid] = pb.MetricState(kind="auc", values=part.state().tolist())
    report(master, "A", a.task_id, metric_sums={"acc": 3.0}, samples=a.end - a.start,
           metric_states={"auc": state["A"], "junk": pb.MetricState(kind="nope", values=[1.0])})
    report(master, "B", b.task_id, metric_sums={"acc": 6.0}, samples=b.end - b.start,
           metric_states={"auc": state["B"]})
    assert set(master.metrics) == {"acc", "auc"}  # an unknown kind is ignored, not fatal
    assert master.metrics["acc"] == pytest.approx(0.3)
    assert master.metrics["auc"] == pytest.approx(roc_auc_score(labels, logits), abs=1e-9)




def test_keras_auc_in_an_elasticdl_module_becomes_flextrains(tmp_path):
    pytest.importorskip("tensorflow")
    module = tmp_path / "kerasauc.py"
    module.write_text(
        "import tensorflow as tf\n"
        "def custom_model():\n    return tf.keras.Sequential([tf.keras.layers.Dense(1)])\n"
        "def loss(labels, predictions):\n    return tf.reduce_mean(predictions)\n"
        "def optimizer(lr=0.1):\n    return tf.keras.optimizers.SGD(lr)\n"
        "def feed(dataset, mode, metadata):\n    return dataset\n"
        "def eval_metrics_fn():\n"
        "    return {'auc': tf.keras.metrics.AUC(from_logits=True), 'pr': tf.keras.metrics.AUC(curve='PR')}\n")
    md = load_model_def(f"{module}:custom_model")
    with pytest.raises(ModelDefError, match=r"kerasauc.py: eval_metrics_fn\(\)\['pr'\] is a .*AUC object"):
        md.metric_fns()
    roc_only = tmp_path / "kerasroc.py"
    roc_only.write_text(module.read_text().replace(", 'pr': tf.keras.metrics.AUC(curve='PR')", ""))
    [(name, metric)] = load_model_def(f"{roc_only}:custom_model").metric_fns().items()
    assert name == "auc" and isinstance(metric, AUC) and metric.from_logits
