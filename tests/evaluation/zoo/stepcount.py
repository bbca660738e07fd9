"""A model whose evaluation metrics are known exactly, for evaluation tests.

Records are CSV lines ``x,label`` (integers). The model has one parameter
``b`` (0 at start); its output for a record is ``[x, b]``. The loss is the
mean of ``b`` over the samples, so with SGD at lr=1 every optimizer step
lowers ``b`` by exactly 1 however the global batch is split: the model of
version ``v`` has ``b == -v``. Metrics (per-sample values, averaged by the
master over every validation record):

* ``step``: ``-b`` -> exactly the version of the model evaluated;
* ``x``: the record's ``x`` -> the mean of the validation ``x``;
* ``accuracy``: ``x % 3 == label`` -> the fraction of records whose label
  agrees (the test data decides which).

``PredictionOutputsProcessor`` appends what it is given to the file named by
``$STEPCOUNT_PROCESSOR_LOG`` (one JSON line per call) and, when
``$STEPCOUNT_PROCESSOR_FAIL_ONCE`` names a file that does not exist yet,
creates it and raises: the first task processed fails after its part file
was written, and is retried.

``$STEPCOUNT_EVAL_GATE`` (a path prefix), until ``<prefix>.release`` exists:
``feed`` in evaluation mode creates ``<prefix>.<pid>`` and waits for the
release, so a test can see which workers are evaluating and kill one of them
mid-evaluation.
"""

import json
import os
import time

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.stack([x, x * 0 + self.b], dim=1)


def loss(labels, predictions):
    return predictions[:, 1].mean()


def optimizer(params, lr=1.0):
    return torch.optim.SGD(params, lr=lr)


def feed(records, mode, metadata):
    gate = os.environ.get("STEPCOUNT_EVAL_GATE")
    if gate and mode == "evaluation" and not os.path.exists(f"{gate}.release"):
        open(f"{gate}.{os.getpid()}", "w").close()
        while not os.path.exists(f"{gate}.release"):  # the test releases it
            time.sleep(0.02)
    rows = [r.decode().split(",") for r in records]
    x = torch.tensor([float(r[0]) for r in rows])
    if mode == "prediction":
        return x
    return x, torch.tensor([int(r[1]) for r in rows])


def eval_metrics_fn():
    return {
        "step": lambda labels, predictions: -predictions[:, 1],
        "x": lambda labels, predictions: predictions[:, 0],
        "accuracy": lambda labels, predictions: (predictions[:, 0].long() % 3 == labels).float(),
    }


class PredictionOutputsProcessor:
    def process(self, predictions, worker_id):
        if "STEPCOUNT_PROCESSOR_LOG" not in os.environ:
            return
        marker = os.environ.get("STEPCOUNT_PROCESSOR_FAIL_ONCE")
        with open(os.environ["STEPCOUNT_PROCESSOR_LOG"], "a") as f:
            f.write(json.dumps({"worker": worker_id, "shape": list(predictions.shape),
                                "x": predictions[:, 0].tolist()}) + "\n")
        if marker:
            try:  # O_EXCL: of two workers processing at once, exactly one fails (an exists() check let both)
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
            raise RuntimeError("processor fails once (test)")
