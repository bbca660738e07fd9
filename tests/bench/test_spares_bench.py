"""bench/spares.py's arithmetic: the ratio of medians baseline / spares and its bootstrap interval."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from spares import ratio_ci  # noqa: E402


def test_ratio_of_medians_with_an_interval_around_it():
    out = ratio_ci([10.0, 12.0, 14.0], [0.1, 0.2, 0.4])
    assert out["ratio"] == 60.0  # 12 / 0.2
    low, high = out["ci95"]
    assert low <= 60.0 <= high and low >= 10.0 / 0.4 and high <= 14.0 / 0.1
    assert ratio_ci([], [0.1]) == {"ratio": None, "ci95": None}


def test_the_keras_zoo_stamps_each_update_applied_inside_a_tf_function(tmp_path, monkeypatch):
    """bench/rescale/zoo_digits_keras.py: a stamp per apply_gradients, also where a tf.function traced it once."""
    tf = __import__("pytest").importorskip("tensorflow")
    from flextrain.worker.module import load_model_def

    monkeypatch.setenv("RESCALE_DIR", str(tmp_path))
    monkeypatch.setenv("FLEXTRAIN_WORKER_ID", "worker-7")
    md = load_model_def(f"{Path(__file__).resolve().parents[2] / 'bench' / 'rescale' / 'zoo_digits_keras.py'}"
                        ":custom_model")  # as a worker loads it (the zoo's `elasticdl` import included)
    model = md.build_model()
    opt = md.build_optimizer(model, 0.1)
    apply = tf.function(lambda grads: opt.apply_gradients(zip(grads, model.trainable_variables)))
    before = [w.numpy().copy() for w in model.trainable_variables]
    for _ in range(3):
        apply([tf.ones_like(w) for w in model.trainable_variables])
    lines = (tmp_path / "steps-worker-7.txt").read_text().splitlines()
    assert [int(line.split()[1]) for line in lines] == [1, 2, 3]  # every call, not only the traced one
    assert all((w.numpy() != b).all() for w, b in zip(model.trainable_variables, before))  # and it did update
