"""A Keras worker prepares its steps before it registers (AllReduceTrainer.prepare with the master's
GetJobSpecResponse.sample): both step functions traced once, for every micro-batch size to come; a
sample that cannot be read costs only that head start."""

from __future__ import annotations

import logging

import pytest

from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.collective import Collective
from flextrain.worker.module import load_model_def
from flextrain.worker.trainer import AllReduceTrainer, WorkerState
from ft_helpers import MODEL_ZOO, FakeMaster

pytest.importorskip("tensorflow")

DIGITS = f"{MODEL_ZOO / 'digits_keras.py'}:custom_model"


def trainer(digits_examples, tmp_path):
    source = str(sorted((digits_examples / "train").iterdir())[0])
    spec = JobSpec.of(name="j", model_def=DIGITS, training_data=source, job_dir=str(tmp_path / "job"),
                      global_batch_size=32, max_micro_batch=16).validate()
    model_def = load_model_def(DIGITS)
    model = model_def.build_model()
    return source, AllReduceTrainer(spec=spec, model_def=model_def, model=model,
                                    optimizer=model_def.build_optimizer(model, 0.1), client=FakeMaster([]),
                                    collective=Collective(), state=WorkerState())


def run(t, source):
    task = pb.Task(task_id=0, source=source, start=0, end=100, global_batch_size=32)  # steps of 16+16, 4
    try:
        assert t.run_task(task) is None
    finally:
        t.loader.close()
    assert t.state.version == 4


def test_steps_are_traced_once_before_registering_for_every_size_to_come(digits_examples, tmp_path):
    source, t = trainer(digits_examples, tmp_path)
    t.prepare(pb.Task(source=source, start=0, end=8))
    assert t.backend.traces() == 2 and t.state.version == 0
    run(t, source)  # micro-batches of 16 and a short last step of 4: no trace more
    assert t.backend.traces() == 2


def test_a_sample_that_cannot_be_read_costs_only_the_head_start(digits_examples, tmp_path, caplog):
    source, t = trainer(digits_examples, tmp_path)
    missing = str(tmp_path / "gone.tfrecord")
    with caplog.at_level(logging.WARNING, logger="flextrain.worker"):
        t.prepare(pb.Task(source=missing, start=0, end=8))
    assert t.backend.traces() == 0
    assert f"could not prepare the model ahead on records [0, 8) of {missing}" in caplog.text
    run(t, source)  # traced at its steps instead: the first size, then relaxed for the short last step
    assert t.backend.traces() == 3
