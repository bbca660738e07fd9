"""The digits classifier with activations as wide as the test asks: memory grows with the micro-batch.

Test-only knobs, read from the environment (inherited from ``flextrain train`` by its workers):

``FT_WIDE``
    Floats of extra activation per sample, e.g. ``4096``, or per worker: ``worker-0=4096,worker-1=16384``
    (the worker is known by its ``--worker-id``; any other process, e.g. preflight, takes the first).
    The forward multiplies an all-ones ``(n, wide)`` tensor by a column of the logits, so autograd keeps
    it for backward: a training step holds a few ``n * wide`` floats at once. The width is also the
    shape of an empty non-persistent buffer, so the probe's cache key (flextrain.elastic.probe.probe_key)
    tells the widths apart, while the broadcast state (state_dict) stays the same for every worker.
``FT_RLIMIT_HEADROOM``
    In a ``flextrain worker`` process, the model's first forward (the micro-batch probe's, or the first
    step's) sets RLIMIT_DATA to the process's data size then plus this many bytes (after starting
    torch's intra-op threads, whose stacks count too): from there on an allocation past it fails with
    torch's "can't allocate memory". A real limit the kernel enforces, on the worker alone.
"""

import os
import re
import resource
import sys

import torch
from torch import nn

from flextrain.data.digits import decode_digits


def _worker_id() -> str | None:
    argv = sys.argv
    return argv[argv.index("--worker-id") + 1] if "--worker-id" in argv and "worker" in argv else None


def _wide() -> int:
    spec = os.environ.get("FT_WIDE", "1024")
    if "=" not in spec:
        return int(spec)
    widths = dict(item.split("=") for item in spec.split(","))
    return int(widths.get(_worker_id(), next(iter(widths.values()))))


def _vm_data() -> int:
    with open("/proc/self/status", "rb") as f:
        return int(re.search(rb"VmData:\s+(\d+)", f.read()).group(1)) * 1024


_limited = False


def _limit_data() -> None:
    global _limited
    headroom = os.environ.get("FT_RLIMIT_HEADROOM")
    if _limited or not headroom or _worker_id() is None:
        return
    _limited = True
    torch.ones(512, 512).sum()  # start the intra-op thread pool now: a thread refused later aborts
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (_vm_data() + int(headroom), hard))


class Model(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.wide = _wide()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.register_buffer("width", torch.empty(0, self.wide), persistent=False)

    def forward(self, x):
        _limit_data()
        out = self.net(x)
        spread = x.new_ones(x.shape[0], self.wide) * out[:, :1]  # (n, wide), kept for backward
        return out + 0.0 * spread.mean(dim=1, keepdim=True)


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
