"""Digits classifier that also counts, in its own state, every sample applied.

``seen`` is a parameter with one slot per training record. Each sample adds
``(seen[id] - seen[id].detach()) / n`` (zero-valued) to the loss, so after
flextrain's scaling and the SUM all-reduce the gradient of ``seen[id]`` is
``1/G`` per time the sample took part in the step. The optimizer adds
``grad * G`` to ``seen``: one count per sample in every *committed* step and
nothing for a step that was never applied. The counts live in the model
state, so they travel with broadcasts to newcomers and with checkpoints, and
the final checkpoint shows exactly which records the final model saw.

Env: FT_COUNT_RECORDS (training records), FT_COUNT_G (global batch; "any" under a batch schedule),
FT_COUNT_DTYPE: the parameters' dtype (float32 by default; float64, bfloat16,
float16, or ``mixed``: a float32 body with a float64 head and counter);
inputs are cast to each layer's dtype. The counts stay exact in every dtype:
a count's gradient is ``size/G * 1/size`` per application, 1/G within a
rounding of the dtype (exactly, for power-of-two micro-batches), which the
optimizer rounds to a whole count; and counts are small integers, exact in
bfloat16 up to 256 (float16: 2048).
FT_COUNT_ARCH=conv: a small conv net instead of the MLP (a 3x3 Conv2d over the 8x8 image, which
``feed`` then gives as a 4-D tensor), for the conv methods of ``--accelerate`` (channels_last, checkpoint).
Records are digits RecordIO records (ids: their record numbers, ``metadata.start..end``) or Parquet
row dicts with the columns ``pixels`` (64 floats in [0, 1]), ``label`` and ``id`` (the record's id).
FT_HANG_WORKER / FT_HANG_FILE: that worker hangs in `feed` once the file exists (and creates ``<file>.hung``).
FT_EXIT_WORKER / FT_EXIT_FILE: once the file exists, that worker exits (code 17) inside its next backward,
after the last parameter's gradient is accumulated and the overlapped reduction's hooks have run: every
bucket but the tail is in flight then (one micro-step per rank: the hooks are armed in it).
FT_SLOW_WORKER / FT_SLOW_SECONDS: that worker's forward takes that many seconds longer (a slow node);
with FT_SLOW_GATE, it builds its optimizer only once that file exists (so that it starts after the others).
FT_BYTES_PER_SAMPLE: the model holds this many bytes (resident) per sample of its largest micro-batch so far,
standing in for activations that grow with the micro-batch (the out-of-memory tests, --worker-memory-limit).
FT_FEED_DELAY: seconds per `feed` call, standing in for a bigger model's compute (the
chaos suite uses it so that a job outlasts the workers it starts and kills); none once the file
FT_FEED_DELAY_UNTIL names exists (a test lifts it when its events are over: the rest trains at full speed).
FT_CHECKSUM_DIR: after every committed step, each worker appends ``"<samples applied> <sha1> <time>"`` to
``<dir>/<worker id>.txt``: the total of the counters (the same on every member of a round at the
same step) and a digest of every parameter and momentum buffer, so tests can compare the members' states.
"""

import hashlib
import os
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from flextrain.data.digits import decode_digits

RECORDS = int(os.environ.get("FT_COUNT_RECORDS", "1408"))
# "any": the global batch varies (a batch schedule): a record's counter gradient is 1/G or 0 in every
# step, whatever G, so a non-zero gradient counts one application.
G = 0 if os.environ.get("FT_COUNT_G") == "any" else int(os.environ.get("FT_COUNT_G", "32"))
DTYPE = os.environ.get("FT_COUNT_DTYPE", "float32")
CONV = os.environ.get("FT_COUNT_ARCH") == "conv"


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10)) \
            if CONV else nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.seen = nn.Parameter(torch.zeros(RECORDS))
        if DTYPE == "mixed":
            self.net[2].double()
            self.seen = nn.Parameter(torch.zeros(RECORDS, dtype=torch.float64))
        else:
            self.to(getattr(torch, DTYPE))

    def forward(self, features):
        _maybe_exit_in_backward(self)
        if _slow():
            time.sleep(float(os.environ["FT_SLOW_SECONDS"]))  # compute this node does slower
        ids = features["id"]
        _hold_memory(len(ids))
        marked = self.seen[ids]
        h = features["x"]
        for layer in self.net:
            h = layer(h.to(layer.weight.dtype) if isinstance(layer, nn.Linear | nn.Conv2d) else h)
        return {"logits": h, "mark": marked - marked.detach()}


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
            p.add_(torch.round(p.grad * G) if G else (p.grad != 0).to(p.dtype))
            p.grad.zero_()
        out = super().step(closure)
        _record_checksum(self)
        return out


def _record_checksum(opt):
    where, me = os.environ.get("FT_CHECKSUM_DIR"), os.environ.get("FLEXTRAIN_WORKER_ID")
    if not (where and me):
        return
    digest = hashlib.sha1()
    for group in opt.param_groups:
        for p in group["params"]:
            digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            buf = opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                digest.update(buf.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    applied = int(sum(float(p.detach().double().sum()) for p in opt.counter))
    with open(os.path.join(where, f"{me}.txt"), "a") as f:
        f.write(f"{applied} {digest.hexdigest()} {time.time():.6f}\n")


def optimizer(params, lr=0.1):
    gate = os.environ.get("FT_SLOW_GATE")
    if _slow() and gate:
        while not Path(gate).exists():  # the test opens the gate once the other workers train
            time.sleep(0.05)
    return CountingSGD(params, lr=lr)


def _slow() -> bool:
    return os.environ.get("FLEXTRAIN_WORKER_ID", "") == os.environ.get("FT_SLOW_WORKER", "-")


def _maybe_exit_in_backward(model):
    me, victim, trigger = os.environ.get("FLEXTRAIN_WORKER_ID"), os.environ.get("FT_EXIT_WORKER"), os.environ.get("FT_EXIT_FILE")
    if not (victim and me == victim and trigger and Path(trigger).exists()) or getattr(model, "_exit_armed", False):
        return
    model._exit_armed = True  # registered now, after the trainer's own hooks: they run first
    params = [p for p in model.parameters() if p.requires_grad]
    done = set()

    def accumulated(p):
        done.add(id(p))
        if len(done) == len(params):
            os._exit(17)

    for p in params:
        p.register_post_accumulate_grad_hook(accumulated)


_HELD = []


def _hold_memory(samples):
    per_sample = int(os.environ.get("FT_BYTES_PER_SAMPLE", "0"))
    if per_sample and (not _HELD or _HELD[0].numel() < samples * per_sample):
        _HELD[:] = [torch.ones(samples * per_sample, dtype=torch.uint8)]  # ones: every page resident


def _maybe_hang():
    me, victim, trigger = os.environ.get("FLEXTRAIN_WORKER_ID"), os.environ.get("FT_HANG_WORKER"), os.environ.get("FT_HANG_FILE")
    if victim and me == victim and trigger and Path(trigger).exists():
        Path(f"{trigger}.hung").touch()  # for a test to act on: this step never reaches its all-reduce
        threading.Event().wait()  # alive (heartbeats go on) but never progressing


def delay_feed():
    """FT_FEED_DELAY seconds (a bigger model's compute), unless the file FT_FEED_DELAY_UNTIL names exists."""
    until = os.environ.get("FT_FEED_DELAY_UNTIL")
    delay = 0.0 if until and Path(until).exists() else float(os.environ.get("FT_FEED_DELAY", "0"))
    if delay:
        time.sleep(delay)


def feed(records, mode, metadata):
    _maybe_hang()
    delay_feed()
    if records and isinstance(records[0], dict):  # a table source: rows with id, pixels or p0..p63, label
        pixels, labels, ids = _rows(records)
    else:
        (pixels, labels), ids = decode_digits(records), torch.arange(metadata.start, metadata.end)
    x = torch.from_numpy(pixels)
    features = {"x": x.view(-1, 1, 8, 8) if CONV else x, "id": ids}
    return features, torch.from_numpy(labels)


def _rows(rows):
    """A table's rows: the record id is the row's ``id`` column (its index in the original data)."""
    if "pixels" in rows[0]:  # Parquet: the 64 pixels as floats in [0, 1], as decode_digits gives them
        pixels = np.array([row["pixels"] for row in rows], dtype=np.float32).reshape(-1, 64)
    else:  # SQL: integer columns p0..p63 in 0..16
        pixels = np.array([[row[f"p{i}"] for i in range(64)] for row in rows], dtype=np.float32) / np.float32(16)
    labels = np.array([row["label"] for row in rows], dtype=np.int64)
    return pixels, labels, torch.tensor([row["id"] for row in rows], dtype=torch.long)


def eval_metrics_fn():
    return {"accuracy": lambda labels, predictions: (predictions["logits"].argmax(dim=1) == labels).float()}
