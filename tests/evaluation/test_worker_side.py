"""Worker side, in-process: TorchPredictor, metric sums, prediction parts, the outputs-processor hook."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from evalcases import STEPCOUNT, stepcount_checkpoint, write_csv
from flextrain.data.predictions import part_name
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.evaluation import evaluate_task, metric_sums
from flextrain.worker.frameworks import make_predictor
from flextrain.worker.pytorch import TorchPredictor
from flextrain.worker.module import FeedMetadata, Mode, ModelDefError, load_model_def
from flextrain.worker.prediction import load_outputs_processor, predict_task


@pytest.fixture
def model_def():
    return load_model_def(STEPCOUNT)


def loaded(model_def, tmp_path, version=4):
    predictor = make_predictor(model_def, model_def.build_model())
    predictor.load_checkpoint(str(stepcount_checkpoint(tmp_path / "m.ckpt", version=version)))
    return predictor


def test_batches_cover_every_record_in_order_in_eval_mode(model_def, tmp_path):
    predictor = loaded(model_def, tmp_path)
    assert isinstance(predictor, TorchPredictor) and predictor.checkpoint_version == 4
    records = [f"{x},0".encode() for x in range(7)]
    out = list(predictor.batches(records, mode=Mode.PREDICTION, metadata=FeedMetadata("f", 0, 7, 0), batch_size=3))
    assert [len(p) for p, _ in out] == [3, 3, 1] and all(labels is None for _, labels in out)
    assert torch.cat([p for p, _ in out]).tolist() == [[float(x), -4.0] for x in range(7)]
    assert predictor.model.training  # the model's mode is restored afterwards


def test_metric_sums_are_sums_of_per_sample_values(model_def, tmp_path):
    predictor = loaded(model_def, tmp_path)
    records = [f"{x},{x % 3}".encode() for x in range(10)]
    sums, n, states = metric_sums(model_def, predictor, records, metadata=FeedMetadata("f", 0, 10, 0), batch_size=4)
    assert n == 10 and sums == {"step": 40.0, "x": 45.0, "accuracy": 10.0} and states == {}


def test_metric_with_one_value_per_batch_is_rejected(model_def, tmp_path):
    predictor = loaded(model_def, tmp_path)
    bad = dataclasses.replace(model_def, eval_metrics_fn=lambda: {
        "mean_x": lambda labels, predictions: predictions[:, 0].mean()})
    with pytest.raises(ModelDefError, match="metric 'mean_x' returned 1 value for 4 samples; it must return one "
                                            "value per sample"):
        metric_sums(bad, predictor, [b"1,1"] * 4, metadata=FeedMetadata("f", 0, 4, 0), batch_size=4)


def test_evaluate_task_reads_the_task_range(model_def, tmp_path):
    data = write_csv(tmp_path / "v.csv", range(20))
    task = pb.Task(task_id=1, kind=pb.Task.EVALUATION, source=str(data), start=5, end=15, global_batch_size=10)
    sums, n, _ = evaluate_task(model_def, loaded(model_def, tmp_path), task, batch_size=3)
    assert n == 10 and sums["x"] == float(sum(range(5, 15)))


def test_a_retried_prediction_task_replaces_its_part(model_def, tmp_path):
    data = write_csv(tmp_path / "p.csv", range(30))
    task = pb.Task(task_id=3, kind=pb.Task.PREDICTION, source=str(data), start=10, end=25, global_batch_size=10)
    predictor = loaded(model_def, tmp_path, version=2)
    for worker in ("worker-0", "worker-1"):  # the same task run twice (a retry on another worker)
        assert predict_task(model_def, predictor, task, output=str(tmp_path / "out"), batch_size=4,
                            worker_id=worker) == 15
    assert [p.name for p in (tmp_path / "out").iterdir()] == [part_name(3)]
    rows = [json.loads(line) for line in (tmp_path / "out" / part_name(3)).read_text().splitlines()]
    assert rows == [{"source": str(data), "index": i, "prediction": [float(i), -2.0]} for i in range(10, 25)]


def test_outputs_processor_contract_is_checked(model_def, tmp_path):
    assert load_outputs_processor(model_def) is not None
    module = tmp_path / "badproc.py"
    module.write_text(open(STEPCOUNT.split(":")[0]).read().replace(
        "    def process(self, predictions, worker_id):", "    def process(self, predictions):"))
    with pytest.raises(ModelDefError, match=r"PredictionOutputsProcessor.process\(predictions\) must take "
                                            r"\(predictions, worker_id\)"):
        load_outputs_processor(load_model_def(f"{module}:Model"))
