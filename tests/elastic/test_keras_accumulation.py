"""flextrain.elastic.keras.Model / Optimizer: one update per global batch equals one step on the whole batch."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import flextrain.elastic.keras as elastic  # noqa: E402
from flextrain.elastic import session as sessions  # noqa: E402
from flextrain.elastic.session import ElasticInitError  # noqa: E402

keras = tf.keras


@pytest.fixture(autouse=True)
def float64_and_fresh(monkeypatch):
    monkeypatch.setattr(elastic, "session", None)
    monkeypatch.setattr(sessions, "_current", None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    before, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")  # exact comparisons: only summation order differs
    # The global dtype policy too: once a test elsewhere has set one (tests/tf), it overrides floatx.
    keras.config.set_dtype_policy("float64")
    yield
    keras.config.set_floatx(before)
    keras.config.set_dtype_policy(policy)


def data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    return x, np.tanh(x @ rng.normal(size=(5, 2))) + 0.1 * rng.normal(size=(n, 2))


def pair():
    """A small model and an independent copy with the same weights."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return model, copy


def close(a, b):
    return all(np.allclose(u, v, rtol=1e-9, atol=1e-12) for u, v in zip(a, b))


@pytest.mark.parametrize("G, make", [(256, lambda: keras.optimizers.SGD(0.5)),
                                     (256, lambda: keras.optimizers.Adam(0.01)),
                                     (250, lambda: keras.optimizers.SGD(0.5))])  # uneven: 63, 63, 62, 62
def test_fit_accumulates_to_the_global_batch_step(G, make):
    s = elastic.init(G, 64)
    assert s.steps == 4 and s.even == (G == 256)
    x, y = data(2 * G)
    model, reference = pair()
    wrapped = elastic.Model(model)
    wrapped.compile(optimizer=make(), loss="mse")
    history = wrapped.fit(x, y, epochs=2, shuffle=False, verbose=0)
    reference.compile(optimizer=make(), loss="mse")
    reference.fit(x, y, batch_size=G, epochs=2, shuffle=False, verbose=0)
    assert int(wrapped.optimizer.iterations) == 4 == int(reference.optimizer.iterations)  # once per update
    assert close(model.get_weights(), reference.get_weights())
    assert not close(model.get_weights(), pair()[0].get_weights())  # it did train
    # The reported loss is the plain mean loss (the uneven weighting touches only the gradient).
    assert len(history.history["loss"]) == 2 and 0 < history.history["loss"][1] < history.history["loss"][0] < 2


def test_without_accumulation_the_same_data_gives_other_weights():
    """The comparison above can fail: 4 updates of 64 are not one of 256."""
    x, y = data(256)
    model, reference = pair()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    model.fit(x, y, batch_size=64, shuffle=False, verbose=0)
    reference.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    reference.fit(x, y, batch_size=256, shuffle=False, verbose=0)
    assert not close(model.get_weights(), reference.get_weights())


@pytest.mark.parametrize("G", [256, 250])
def test_custom_loop_optimizer_applies_every_steps_calls(G):
    s = elastic.init(G, 64)
    x, y = data(G)
    model, reference = pair()
    optimizer = elastic.Optimizer(keras.optimizers.SGD(0.5))
    mse = keras.losses.MeanSquaredError()
    applied, start = [], 0
    for size in s.batch_sizes:
        with tf.GradientTape() as tape:
            loss = mse(y[start:start + size], model(x[start:start + size]))
        grads = tape.gradient(loss, model.trainable_variables)
        applied.append(bool(optimizer.apply_gradients(zip(grads, model.trainable_variables))))
        start += size
    assert applied == [False, False, False, True] and bool(optimizer.applied)
    assert int(optimizer.iterations) == 1
    plain = keras.optimizers.SGD(0.5)
    with tf.GradientTape() as tape:
        loss = mse(y, reference(x))
    plain.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables))
    assert close(model.get_weights(), reference.get_weights())


def test_the_wrapped_model_predicts_evaluates_and_saves_as_the_original(tmp_path):
    elastic.init(256, 64)
    x, y = data(256)
    model, _ = pair()
    wrapped = elastic.Model(model)
    wrapped.compile(optimizer="sgd", loss="mse")
    wrapped.fit(x, y, verbose=0)
    assert np.array_equal(wrapped.predict(x, verbose=0), model.predict(x, verbose=0))
    assert wrapped.evaluate(x, y, verbose=0) == pytest.approx(model.evaluate(x, y, verbose=0), rel=1e-12)
    wrapped.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")  # plain Keras, no flextrain classes
    assert type(loaded) is type(model)
    assert np.array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert loaded.optimizer.gradient_accumulation_steps == 4 and int(loaded.optimizer.iterations) == 1


def test_disagreements_are_errors_naming_the_argument():
    elastic.init(256, 64)
    model, _ = pair()
    with pytest.raises(ElasticInitError, match=r"Model: steps=3 disagrees with init's plan of 4"):
        elastic.Model(model, steps=3)
    with pytest.raises(ElasticInitError, match=r"Optimizer: steps=2 disagrees"):
        elastic.Optimizer(keras.optimizers.SGD(), steps=2)
    wrapped = elastic.Model(model, steps=4)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    with pytest.raises(ElasticInitError, match="learning-rate schedules are not supported"):
        wrapped.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    wrapped.compile(optimizer="sgd", loss="mse")
    x, y = data(256)
    with pytest.raises(ElasticInitError, match=r"Model.fit: batch_size=32 disagrees with init's plan"):
        wrapped.fit(x, y, batch_size=32, verbose=0)
    used = keras.optimizers.SGD()
    used.build(model.trainable_variables)
    with pytest.raises(ElasticInitError, match="already used"):
        elastic.Optimizer(used)


def test_without_init_steps_alone_gives_plain_accumulation():
    with pytest.raises(ElasticInitError, match=r"call flextrain.elastic.keras.init"):
        elastic.Optimizer(keras.optimizers.SGD())
    optimizer = elastic.Optimizer(keras.optimizers.SGD(), steps=2)
    assert optimizer.optimizer.gradient_accumulation_steps == 2 and optimizer.session is None
