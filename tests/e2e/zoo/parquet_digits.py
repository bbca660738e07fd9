"""The digits classifier of model_zoo/digits_torch.py, fed from Parquet rows.

The training and validation data are Parquet files with the columns
``pixels`` (a list of 64 float32 values in [0, 1]) and ``label`` (int64).
Each record ``feed`` gets is one row as a dict, column name -> Python value.
``columns`` names the columns ``feed`` needs, so only those are read.
"""

import numpy as np
import torch
from torch import nn

columns = ["pixels", "label"]


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
    features = torch.from_numpy(np.array([row["pixels"] for row in records], dtype=np.float32).reshape(-1, 64))
    if mode == "prediction":
        return features
    return features, torch.tensor([row["label"] for row in records], dtype=torch.int64)


def eval_metrics_fn():
    return {"accuracy": lambda labels, predictions: (predictions.argmax(dim=1) == labels).float()}
