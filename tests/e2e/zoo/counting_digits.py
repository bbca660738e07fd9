"""Digits classifier that also counts, in its own state, every sample applied.

``seen`` is a parameter with one slot per training record. Each sample adds
``(seen[id] - seen[id].detach()) / n`` (zero-valued) to the loss, so after
flextrain's scaling and the SUM all-reduce the gradient of ``seen[id]`` is
``1/G`` per time the sample took part in the step. The optimizer adds
``grad * G`` to ``seen``: one count per sample in every *committed* step and
nothing for a step that was never applied. The counts live in the model
state, so they travel with broadcasts to newcomers and with checkpoints, and
the final checkpoint shows exactly which records the final model saw.

Env: FT_COUNT_RECORDS (training records), FT_COUNT_G (global batch),
FT_HANG_WORKER / FT_HANG_FILE: that worker hangs in `feed` once the file exists.
"""

import os
import threading
from pathlib import Path

import torch
from torch import nn

from flextrain.data.digits import decode_digits

RECORDS = int(os.environ.get("FT_COUNT_RECORDS", "1408"))
G = int(os.environ.get("FT_COUNT_G", "32"))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.seen = nn.Parameter(torch.zeros(RECORDS))

    def forward(self, features):
        ids = features["id"]
        marked = self.seen[ids]
        return {"logits": self.net(features["x"]), "mark": marked - marked.detach()}


def loss(labels, predictions):
    n = labels.shape[0]
    return nn.functional.cross_entropy(predictions["logits"], labels) + predictions["mark"].sum() / n


class CountingSGD(torch.optim.SGD):
    def __init__(self, params, lr=0.1):
        params = list(params)
        self.counter = [p for p in params if p.dim() == 1 and p.numel() == RECORDS]
        super().__init__([p for p in params if all(p is not c for c in self.counter)], lr=lr, momentum=0.9)
        self.add_param_group({"params": self.counter, "lr": 0.0, "momentum": 0.0})

    @torch.no_grad()
    def step(self, closure=None):
        for p in self.counter:
            p.add_(torch.round(p.grad * G))
            p.grad.zero_()
        return super().step(closure)


def optimizer(params, lr=0.1):
    return CountingSGD(params, lr=lr)


def _maybe_hang():
    me, victim, trigger = os.environ.get("FLEXTRAIN_WORKER_ID"), os.environ.get("FT_HANG_WORKER"), os.environ.get("FT_HANG_FILE")
    if victim and me == victim and trigger and Path(trigger).exists():
        threading.Event().wait()  # alive (heartbeats go on) but never progressing


def feed(records, mode, metadata):
    _maybe_hang()
    pixels, labels = decode_digits(records)
    features = {"x": torch.from_numpy(pixels), "id": torch.arange(metadata.start, metadata.end)}
    return features, torch.from_numpy(labels)


def eval_metrics_fn():
    return {"accuracy": lambda labels, predictions: (predictions["logits"].argmax(dim=1) == labels).float()}
