"""KerasBackend with float64, bfloat16, float16 and mixed trainable weights: one gradient buffer per
dtype, a step equal to plain Keras' in the same dtype, and state that keeps every dtype."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flextrain.elastic.statecodec import decode, encode

tf = pytest.importorskip("tensorflow")

from flextrain.worker.tf.backend import KerasBackend  # noqa: E402

KINDS = {"float64": ("float64", "float64"), "bfloat16": ("bfloat16", "bfloat16"),
         "float16": ("float16", "float16"), "mixed": ("float32", "float64")}  # (body, head)
TORCH = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {"float64": 1e-12, "float32": 1e-6, "bfloat16": 1e-2, "float16": 1e-3}


def model(kind: str):
    body, head = KINDS[kind]
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(6,))
    hidden = tf.keras.layers.Dense(8, activation="tanh", dtype=body)(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2, dtype=head)(hidden))


def loss(labels, predictions):
    return tf.reduce_mean(tf.square(predictions - tf.cast(labels, predictions.dtype)))


def backend(kind: str) -> KerasBackend:
    m = model(kind)
    opt = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    opt.build(m.trainable_variables)  # as the module loader does: the slots exist up front
    return KerasBackend(model_def=SimpleNamespace(path=f"{kind}.py", loss=loss), model=m, optimizer=opt, extra=3)


def data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((10, 6)).astype(np.float32), rng.standard_normal((10, 2)).astype(np.float32)


def test_buffers_follow_the_trainable_weights_dtypes():
    b = backend("mixed")
    assert [(t.dtype, t.numel()) for t in b.buffers] == [(torch.float32, 6 * 8 + 8 + 3), (torch.float64, 8 * 2 + 2)]
    assert b.slots.data_ptr() == b.buffers[0][6 * 8 + 8:].data_ptr()
    only = backend("bfloat16")
    assert [(t.dtype, t.numel()) for t in only.buffers] == [(torch.bfloat16, 6 * 8 + 8 + 8 * 2 + 2 + 3)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_step_equals_a_plain_keras_step_in_the_same_dtype(kind):
    x, y = data()
    reference = model(kind)
    opt = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    b = backend(kind)
    for _ in range(2):  # two steps: the momentum slots count too
        with tf.GradientTape() as tape:
            value = loss(y, reference(x, training=True))
        opt.apply_gradients(zip(tape.gradient(value, reference.trainable_variables), reference.trainable_variables))
        b.zero()
        b.accumulate(x, y, slice(0, 10), scale=1.0)
        b.apply()
    for got, want in zip(b.model.weights, reference.weights):
        dtype = KINDS[kind][0] if got.shape[0] == 6 or got.shape == (8,) else KINDS[kind][1]
        assert str(got.dtype) == str(want.dtype) == dtype, got.path
        tol = max(TOLERANCE[d] for d in KINDS[kind])  # a float64 head sees its float32 body's rounding
        np.testing.assert_allclose(np.asarray(got.numpy(), np.float64), np.asarray(want.numpy(), np.float64),
                                   rtol=tol, atol=tol, err_msg=got.path)


@pytest.mark.parametrize("kind", ["mixed", "bfloat16"])
def test_uneven_micro_batches_add_up_to_the_whole_batch_gradient(kind):
    x, y = data()
    b = backend(kind)
    b.zero()
    b.accumulate(x, y, slice(0, 3), scale=3 / 10)
    b.accumulate(x, y, slice(3, 10), scale=7 / 10)
    with tf.GradientTape() as tape:
        value = loss(y, b.model(x, training=True))
    grads = tape.gradient(value, b.model.trainable_variables)
    for view, grad in zip(b._views, grads):
        assert view.dtype == grad.numpy().dtype
        tol = 5 * max(TOLERANCE[d] for d in KINDS[kind])  # float32 activations feed the float64 head
        np.testing.assert_allclose(np.asarray(view, np.float64), np.asarray(grad.numpy(), np.float64),
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["mixed", "bfloat16"])
def test_state_round_trips_with_its_dtypes_and_the_next_step_is_the_same(kind):
    x, y = data()
    veteran, newcomer = backend(kind), backend(kind)
    for b in (veteran,):
        b.zero()
        b.accumulate(x, y, slice(0, 10), scale=1.0)
        b.apply()
    state = veteran.state()
    tree = decode(encode(state))
    for part in ("model", "optimizer"):
        for key, value in state[part].items():
            assert tree[part][key].dtype == value.dtype and torch.equal(tree[part][key], value), key
    assert {str(v.dtype) for v in tree["model"].values()} == {f"torch.{d}" for d in KINDS[kind]}
    newcomer.load_state(tree)
    for b in (veteran, newcomer):
        b.zero()
        b.accumulate(x, y, slice(0, 10), scale=1.0)
        b.apply()
    for a, b in zip(veteran.model.weights, newcomer.model.weights):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a.numpy(), np.float64), np.asarray(b.numpy(), np.float64))


def test_integer_weights_are_refused_as_trainable():
    class Counter(tf.keras.layers.Layer):
        def build(self, _):
            self.n = self.add_weight(name="n", shape=(), dtype="int32", initializer="zeros", trainable=True)

        def call(self, x):
            return x

    inputs = tf.keras.Input(shape=(2,))
    m = tf.keras.Model(inputs, Counter()(inputs))
    with pytest.raises(ValueError, match=r"trainable weights must be float32, float64, bfloat16 or float16"):
        KerasBackend(model_def=SimpleNamespace(path="c.py", loss=loss), model=m,
                     optimizer=tf.keras.optimizers.SGD(), extra=3)


COUNTING = Path(__file__).resolve().parent / "zoo" / "counting_keras.py"


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_keras_ps_keeps_the_dtype_of_dense_weights_and_tables(two_ps, tmp_path, dtype):
    """One task of 32 records in micro-batches of 12/12/8: every record counted once on the PS, in the
    model's dtype (dense parameter and embedding table alike)."""
    from flextrain.data import write_records
    from flextrain.job import JobSpec, Strategy
    from flextrain.proto import flextrain_pb2 as pb
    from flextrain.worker.module import load_model_def
    from flextrain.worker.ps_keras import KerasPSTrainer
    from flextrain.worker.trainer import WorkerState
    from ft_helpers import FakeMaster

    source = tmp_path / "ids.rio"
    write_records(source, [str(i).encode() for i in range(64)])
    n, first = 32, 16
    spec = JobSpec.of(name="j", model_def=f"{COUNTING}:{dtype}_model", training_data=str(source), job_dir=str(tmp_path),
                   strategy=Strategy.PARAMETER_SERVER, ps=2, global_batch_size=n, max_micro_batch=12,
                   learning_rate=n).validate()
    md = load_model_def(spec.model_def)
    model = md.build_model()
    master = FakeMaster([pb.Task(task_id=0, kind=pb.Task.TRAINING, source=str(source), start=first, end=first + n,
                                 global_batch_size=n)])
    trainer = KerasPSTrainer(spec=spec, model_def=md, model=model, optimizer=md.build_optimizer(model, float(n)),
                             client=master, state=WorkerState(), ps_addresses=two_ps)
    try:
        assert [t[3] for t in trainer.tables.values()] == [dtype]
        assert trainer.train() is True and master.reports == [(0, {"ok": True})]
        _, dense = trainer.ps.pull_dense(None)
        ((name, seen),) = dense.items()
        (table,) = trainer.tables
        rows = trainer.ps.pull_embedding(table, np.arange(64))
        want = torch.zeros(64, dtype=TORCH[dtype])
        want[first: first + n] = 1
        assert seen.dtype == rows.dtype == TORCH[dtype]
        assert torch.equal(seen, want) and torch.equal(rows[:, 0], want)
        assert str(trainer.variables[name].dtype) == dtype  # pulled back into Keras in its dtype
    finally:
        trainer.close()


@pytest.mark.parametrize("kind", list(KINDS))
def test_steps_prepared_ahead_are_traced_once_for_every_micro_batch_size(kind):
    x, y = data()
    b = backend(kind)
    before = [v.numpy().copy() for v in b.model.weights + list(b.optimizer.variables)]
    b.prepare(lambda: (tf.constant(x[:2]), tf.constant(y[:2])))  # as the worker does with the sample's records
    for got, want in zip(b.model.weights + list(b.optimizer.variables), before):  # traced, not run
        np.testing.assert_array_equal(got.numpy(), want)
    for sizes in ((10,), (3, 7), (4, 4, 2)):  # a step of one, two or three micro-batches: other shapes
        b.zero()
        start = 0
        for n in sizes:
            b.accumulate(x, y, slice(start, start + n), scale=n / 10)
            start += n
        b.apply()
    assert b._gradients_fn.experimental_get_tracing_count() == 1
    assert b._apply_fn.experimental_get_tracing_count() == 1
    assert int(b.optimizer.iterations.numpy()) == 3
