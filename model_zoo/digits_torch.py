"""A PyTorch digits classifier, and a worked example of the module contract.

flextrain imports this file in every worker and looks for these names:

``Model`` (named by ``--model-def model_zoo/digits_torch.py:Model``)
    A zero-argument callable returning a ``torch.nn.Module``. Every worker
    builds one; the first round broadcasts rank 0's weights, so all start equal.

``loss(labels, predictions)``
    The MEAN loss over the samples given. flextrain rescales it so that one
    optimizer step's gradient is the mean over exactly the global batch,
    however the samples were split into micro-batches and workers.

``optimizer(params, lr=...)``
    Returns a ``torch.optim.Optimizer``; ``flextrain train --lr`` overrides
    the default learning rate.

``feed(records, mode, metadata)``
    Turns a list of raw records (``bytes``, here 65-byte digits records:
    64 pixels + label, see ``flextrain data digits``) into
    ``(features, labels)`` tensors whose first dimension is ``len(records)``.
    ``mode`` is "training", "evaluation" or "prediction" (features only).
    ``metadata`` tells the source file and record range.

``eval_metrics_fn()`` (optional)
    ``{name: fn(labels, predictions)}``; each fn returns one value per sample
    and the reported metric is their mean over the whole validation set.
"""

import torch
from torch import nn

from flextrain.data.digits import decode_digits


class Model(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def loss(labels, predictions):
    return nn.functional.cross_entropy(predictions, labels)


def optimizer(params, lr=0.1):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def feed(records, mode, metadata):
    pixels, labels = decode_digits(records)
    features = torch.from_numpy(pixels)
    if mode == "prediction":
        return features
    return features, torch.from_numpy(labels)


def eval_metrics_fn():
    return {"accuracy": lambda labels, predictions: (predictions.argmax(dim=1) == labels).float()}
