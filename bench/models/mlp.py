"""Benchmark model: an MLP classifier over synthetic dense features.

Follows the model-zoo module contract (see ``model_zoo/digits_torch.py``) so
the very same file is used by ``bench/overhead.py``'s plain PyTorch loop and
by ``flextrain train --model-def bench/models/mlp.py:Model``.

RECORD FORMAT (written by ``bench/overhead.py``): ``RECORD_BYTES`` = 1028
bytes = ``FEATURES`` (256) little-endian float32 features followed by the
label as a little-endian int32 (0..CLASSES-1).

Benchmark instrumentation: with ``FLEXTRAIN_BENCH_STEP_TIMES=path`` in the
environment, ``optimizer`` registers a post-step hook that records
``time.perf_counter()`` after every optimizer step (in ``STEP_TIMES``), and the
list is written to ``path`` as JSON when the process exits. It costs one clock
read per step and works the same in flextrain's worker and in a plain loop.
"""

import atexit
import json
import os
import time
import warnings

import numpy as np
import torch
from torch import nn

from flextrain.data import records_array

FEATURES = 256
HIDDEN = 1024
CLASSES = 10
RECORD_DTYPE = np.dtype([("x", "<f4", (FEATURES,)), ("y", "<i4")])
RECORD_BYTES = RECORD_DTYPE.itemsize  # 1028


class Model(nn.Module):
    def __init__(self, features: int = FEATURES, hidden: int = HIDDEN, classes: int = CLASSES):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)


def loss(labels, predictions):
    return nn.functional.cross_entropy(predictions, labels)


def optimizer(params, lr=0.05):
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    path = os.environ.get(STEP_TIMES_ENV)
    if path:
        track_steps(opt)
        _dump_at_exit(path)
    return opt


STEP_TIMES_ENV = "FLEXTRAIN_BENCH_STEP_TIMES"
STEP_TIMES: list[float] = []  # time.perf_counter() after each tracked optimizer step
_dump_path: str | None = None


def track_steps(opt, times: list[float] | None = None) -> None:
    """Append ``time.perf_counter()`` to ``times`` (default ``STEP_TIMES``) after every ``opt.step()``."""
    into = STEP_TIMES if times is None else times
    opt.register_step_post_hook(lambda *_: into.append(time.perf_counter()))


def _dump_at_exit(path: str) -> None:
    global _dump_path
    if _dump_path is None:
        atexit.register(_dump_step_times)
    _dump_path = path


def _dump_step_times() -> None:
    if STEP_TIMES and _dump_path:  # processes that never stepped (e.g. the master) write nothing
        with open(_dump_path, "w") as f:
            json.dump(STEP_TIMES, f)


def encode(features: np.ndarray, labels: np.ndarray) -> list[bytes]:
    """(n, FEATURES) float32 features and (n,) int labels -> n records."""
    rows = np.empty(len(labels), dtype=RECORD_DTYPE)
    rows["x"], rows["y"] = features, labels
    return [row.tobytes() for row in rows]


# feed gets a flextrain.data.RecordBatch: the step's records viewed in the reader's decoded chunk,
# no bytes object per record and no copy (see docs/module-contract.md).
record_batch = True
# The features are a read-only view of the decoded records; the model never writes its input.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


def decode(records) -> tuple[np.ndarray, np.ndarray]:
    """The records (a RecordBatch or a list of bytes) -> (x float32 (n, FEATURES), a view whose rows
    are RECORD_BYTES apart; y int64 (n,))."""
    rows = records_array(records, RECORD_DTYPE)
    return rows["x"], rows["y"].astype(np.int64)


def feed(records, mode, metadata):
    x, y = decode(records)
    features = torch.from_numpy(x)  # a view: Linear reads rows RECORD_BYTES apart as they are
    if mode == "prediction":
        return features
    return features, torch.from_numpy(y)


def eval_metrics_fn():
    return {"accuracy": lambda labels, predictions: (predictions.argmax(dim=1) == labels).float()}
