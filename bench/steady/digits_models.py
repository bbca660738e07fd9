"""Model-zoo module for bench/ddp_steady.py: the digits MLP, and a wide one (13.3 M parameters).

``Model``: model_zoo/digits_torch.py's 64 -> 64 -> 10 MLP (4.8 k parameters: latency-bound).
``Wide``: 64 -> 2560 -> 2560 -> 2560 -> 10 (13.3 M parameters, 53 MB of float32 gradients per
step: the all-reduce's bandwidth matters). Both with SGD + momentum and the zoo's loss and feed.

With ``BENCH_STEP_DIR`` set, every optimizer step appends ``time.perf_counter()`` to
``$BENCH_STEP_DIR/steps-<pid>.txt`` (line-buffered; the DDP side records the same way).
"""

import importlib.util
import os
import time
from pathlib import Path

import torch
from torch import nn

_DIR = os.environ.get("BENCH_STEP_DIR")


def _load_zoo():
    path = Path(__file__).resolve().parents[2] / "model_zoo" / "digits_torch.py"
    spec = importlib.util.spec_from_file_location("_bench_steady_zoo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_zoo = _load_zoo()
Model, loss, feed = _zoo.Model, _zoo.loss, _zoo.feed
WIDE = 2560


class Wide(nn.Module):
    def __init__(self, hidden: int = WIDE):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


MODELS = {"digits": Model, "wide": Wide}


class StampingSGD(torch.optim.SGD):
    """SGD with momentum that appends time.perf_counter() after every step it applies."""

    def __init__(self, params, lr=0.05, momentum=0.9):
        super().__init__(params, lr=lr, momentum=momentum)
        self._log = open(os.path.join(_DIR, f"steps-{os.getpid()}.txt"), "a", buffering=1) if _DIR else None

    def step(self, closure=None):
        out = super().step(closure)
        if self._log is not None:
            self._log.write(f"{time.perf_counter():.6f}\n")
        return out


def optimizer(params, lr=0.05):
    return StampingSGD(params, lr=lr)
