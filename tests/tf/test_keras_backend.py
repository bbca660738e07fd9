"""KerasBackend: gradients into the shared flat buffer, and the state a newcomer receives by broadcast."""

from __future__ import annotations

import numpy as np
import pytest

from ft_helpers import MODEL_ZOO
from flextrain.data.example import encode_example
from flextrain.elastic.statecodec import decode, encode
from flextrain.worker.module import FeedMetadata, Mode, load_model_def

tf = pytest.importorskip("tensorflow")

from flextrain.worker.frameworks import make_backend  # noqa: E402

DIGITS = f"{MODEL_ZOO / 'digits_keras.py'}:custom_model"
RNG = np.random.default_rng(0)
RECORDS = [encode_example({"image": RNG.integers(0, 17, 64).astype(np.float32), "label": [int(i % 10)]})
           for i in range(20)]


def backend(seed: int):
    md = load_model_def(DIGITS)
    tf.keras.utils.set_random_seed(seed)
    model = md.build_model()
    return make_backend(model_def=md, model=model, optimizer=md.build_optimizer(model, 0.1), extra=3)


def step(b, features, labels):
    b.zero()
    b.accumulate(features, labels, slice(0, 7), scale=7 / 20)
    b.accumulate(features, labels, slice(7, 20), scale=13 / 20)
    b.apply()


def test_gradients_land_in_the_flat_buffer_and_control_slots_stay_free():
    b = backend(1)
    features, labels = b.feed(RECORDS, Mode.TRAINING, FeedMetadata("mem", 0, 20, 0))
    b.zero()
    b.accumulate(features, labels, slice(0, 20), scale=1.0)
    (flat,) = b.buffers  # one dtype: one buffer, the control slots at its end
    assert flat.shape[0] == b.size + 3 and b.size == 64 * 64 + 64 + 64 * 10 + 10
    assert flat[: b.size].abs().sum() > 0 and b.slots.abs().sum() == 0 and b.slots.data_ptr() == flat[b.size:].data_ptr()
    # the buffer holds exactly the gradient of the mean loss (labels were shuffled with their features)
    with tf.GradientTape() as tape:
        loss = b.model_def.loss(labels, b.model(features, training=True))
    expected = np.concatenate([g.numpy().ravel() for g in tape.gradient(loss, b.model.trainable_variables)])
    np.testing.assert_allclose(flat[: b.size].numpy(), expected, rtol=1e-5, atol=1e-7)


def test_newcomer_takes_model_and_optimizer_state_and_then_steps_identically():
    veteran, newcomer = backend(1), backend(2)
    features, labels = veteran.feed(RECORDS, Mode.TRAINING, FeedMetadata("mem", 0, 20, 0))
    for _ in range(3):  # momentum slots and the iteration count are now non-trivial
        step(veteran, features, labels)
    assert not np.allclose(veteran.model.weights[0].numpy(), newcomer.model.weights[0].numpy())
    newcomer.load_state(decode(encode(veteran.state())))  # what the round's broadcast carries
    for a, b in zip(veteran.optimizer.variables, newcomer.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(newcomer.optimizer.iterations.numpy()) == 3
    step(veteran, features, labels)
    step(newcomer, features, labels)
    for a, b in zip(veteran.model.weights, newcomer.model.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_state_of_another_model_is_refused_naming_the_mismatch():
    other = load_model_def(f"{MODEL_ZOO / 'deepfm_keras.py'}:custom_model")
    model = other.build_model()
    foreign = make_backend(model_def=other, model=model, optimizer=other.build_optimizer(model, None), extra=3)
    with pytest.raises(ValueError, match="model state has .* variables, this model has"):
        backend(1).load_state(foreign.state())


@pytest.mark.parametrize("keep_lr, expected", [(True, 0.01), (False, 0.1)])
def test_a_given_learning_rate_outlives_the_loaded_optimizer_state(keep_lr, expected):
    saved = backend(0)
    features, labels = saved.feed(RECORDS, Mode.TRAINING, FeedMetadata("mem", 0, 20, 0))
    step(saved, features, labels)  # the optimizer has state (and its learning rate, 0.1) to load
    md = load_model_def(DIGITS)
    model = md.build_model()
    b = make_backend(model_def=md, model=model, optimizer=md.build_optimizer(model, 0.01), extra=3, keep_lr=keep_lr)
    b.load_state(decode(encode(saved.state())))
    assert float(b.optimizer.learning_rate) == pytest.approx(expected)
    assert int(b.optimizer.iterations.numpy()) == 1  # the rest of the optimizer's state is the loaded one


def test_lr_rules_scale_the_built_learning_rate_and_a_schedule_is_refused_naming_it():
    b = backend(1)
    assert b.scale_lr(2.5) == [pytest.approx(0.25)] and float(b.optimizer.learning_rate) == pytest.approx(0.25)
    assert b.scale_lr(0.5) == [pytest.approx(0.05)]  # always times the built one, never compounded
    md = load_model_def(DIGITS)
    model = md.build_model()
    decay = tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    scheduled = make_backend(model_def=md, model=model, optimizer=tf.keras.optimizers.SGD(decay), extra=0)
    with pytest.raises(Exception, match=r"digits_keras.py: --lr-rule scales the optimizer's learning rate, but "
                                        r"optimizer\(\.\.\.\) returned a SGD whose learning_rate is a schedule "
                                        r"\(ExponentialDecay\)"):
        scheduled.scale_lr(2.0)


def test_adascale_measurement_is_each_micro_batch_size_times_its_squared_gradient():
    """Σ nᵢ‖gᵢ‖² (gᵢ: micro-batch i's mean-loss gradient), what --lr-rule adascale needs, in float64."""
    b = backend(1)
    b.measure_micro_batches()
    features, labels = b.feed(RECORDS, Mode.TRAINING, FeedMetadata("mem", 0, 20, 0))
    expected = 0.0
    for sl in (slice(0, 7), slice(7, 20)):
        with tf.GradientTape() as tape:
            loss = b.model_def.loss(labels[sl], b.model({k: v[sl] for k, v in features.items()}
                                                         if isinstance(features, dict) else features[sl],
                                                         training=True))
        grads = tape.gradient(loss, b.model.trainable_variables)
        expected += (sl.stop - sl.start) * sum(float(np.sum(g.numpy().astype(np.float64) ** 2)) for g in grads)
    for _ in range(2):  # zero() starts each step's sum afresh
        b.zero()
        b.accumulate(features, labels, slice(0, 7), scale=7 / 20)
        b.accumulate(features, labels, slice(7, 20), scale=13 / 20)
        assert float(b.micro_sqr) == pytest.approx(expected, rel=1e-5)
