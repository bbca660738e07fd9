"""The digits classifier over a table: rows ``{"p0": .., ..., "p63": .., "label": ..}`` (flextrain.data.sql).

``columns`` names what ``feed`` needs, so the source reads only those columns (the test tables
carry an extra ``note`` column that is never read).
"""

import numpy as np
import torch
from torch import nn

PIXELS = [f"p{i}" for i in range(64)]
columns = [*PIXELS, "label"]


def Model():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def loss(labels, predictions):
    return nn.functional.cross_entropy(predictions, labels)


def optimizer(params, lr=0.1):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def feed(records, mode, metadata):
    assert all(set(row) == set(columns) for row in records), "the source read columns feed did not ask for"
    x = torch.from_numpy(np.array([[row[p] for p in PIXELS] for row in records], dtype=np.float32) / 16.0)
    if mode == "prediction":
        return x
    return x, torch.tensor([row["label"] for row in records], dtype=torch.long)


def eval_metrics_fn():
    return {"accuracy": lambda labels, predictions: (predictions.argmax(dim=1) == labels).float()}
