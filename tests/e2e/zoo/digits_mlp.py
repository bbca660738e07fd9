"""The digits MLP, loss, optimizer and accuracy metric that the data-source test modules share.

Each of those modules (parquet_digits, table_digits, custom_reader_digits, converted_digits)
defines only how its source's records become tensors (``feed``) and imports the rest from here
(the module loader puts a module's own directory on ``sys.path`` while it imports it).
"""

import torch
from torch import nn


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


def eval_metrics_fn():
    return {"accuracy": lambda labels, predictions: (predictions.argmax(dim=1) == labels).float()}
