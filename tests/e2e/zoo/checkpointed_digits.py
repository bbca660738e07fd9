"""The digits classifier with one layer used twice: once plainly, once inside re-entrant activation
checkpointing. Backward accumulates that layer's gradient twice, the second time after its bucket
may have left (flextrain/worker/buckets.py: the bucket is spoiled and the step reduced again, flat).
``loss``, ``optimizer`` and ``feed`` are model_zoo/digits_torch.py's."""

import importlib.util
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

ZOO = Path(__file__).resolve().parents[3] / "model_zoo"


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


def _digits_torch():
    spec = importlib.util.spec_from_file_location("_digits_torch", ZOO / "digits_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


loss, optimizer, feed = (getattr(_digits_torch(), name) for name in ("loss", "optimizer", "feed"))  # the zoo's
