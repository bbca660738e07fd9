"""The digits classifier with one layer used twice: once plainly, once inside re-entrant activation
checkpointing. Backward accumulates that layer's gradient twice, the second time after its bucket
may have left (flextrain/worker/buckets.py: the bucket is spoiled and the step reduced again, flat)."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from flextrain.data.digits import decode_digits


class Model(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.stem = nn.Linear(64, hidden)  # first: its bucket is the tail, launched after backward
        self.shared = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 10)

    def _block(self, h):
        return torch.relu(self.shared(h))

    def forward(self, x):
        h = self._block(torch.relu(self.stem(x)))
        h = checkpoint(self._block, h, use_reentrant=True)
        return self.head(h)


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
