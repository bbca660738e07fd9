"""A model for ParameterServer jobs that counts, on the PS, every time a record is applied.

Two counters with one slot per training record: ``seen`` (a dense parameter,
on one PS) and ``seen_rows`` (an embedding table, rows spread over every PS).
The loss is ``-(mark.sum()) / n`` with zero-valued marks, so the gradient of
a record's slot is ``-1/n`` per time it is in a minibatch of ``n`` records;
with plain SGD at ``lr = G`` (``--lr`` = the global batch, every minibatch
full) the PS adds exactly 1 per application. A SYNC PS averaging
``grads_to_wait`` pushes adds ``1 / grads_to_wait``. Nothing else is learnt.

Env: FT_COUNT_RECORDS (training records), FT_COUNT_DTYPE (both counters' dtype:
float32 by default, float64, bfloat16 or float16; counts of at most 256 / 2048
are exact in bfloat16 / float16, and so is the update ``lr * 1/G``),
FT_FEED_DELAY (seconds per feed; none once the file FT_FEED_DELAY_UNTIL names exists),
FT_FEED_MARKS (a directory where each worker leaves a file named by its id once it trains: its first ``feed``),
FT_DIE_WORKER / FT_DIE_AFTER: that worker SIGKILLs itself in its
FT_DIE_AFTER-th call of ``feed`` (right after pushing the minibatch before).
"""

import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

from flextrain.data.digits import decode_digits

RECORDS = int(os.environ.get("FT_COUNT_RECORDS", "1408"))
DTYPE = getattr(torch, os.environ.get("FT_COUNT_DTYPE", "float32"))
_feeds = 0


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = nn.Parameter(torch.zeros(RECORDS, dtype=DTYPE))
        self.seen_rows = nn.Embedding(RECORDS, 1, dtype=DTYPE)
        nn.init.zeros_(self.seen_rows.weight)

    def forward(self, features):
        ids = features["id"]
        dense = self.seen[ids]
        rows = self.seen_rows(ids).reshape(-1)
        return (dense - dense.detach()) + (rows - rows.detach())


def loss(labels, predictions):
    return -predictions.sum() / labels.shape[0]


def optimizer(params, lr=32.0):
    return torch.optim.SGD(params, lr=lr)


def feed(records, mode, metadata):
    global _feeds
    _feeds += 1
    if _feeds == 1 and os.environ.get("FT_FEED_MARKS"):
        Path(os.environ["FT_FEED_MARKS"], os.environ.get("FLEXTRAIN_WORKER_ID", "worker")).touch()
    if os.environ.get("FLEXTRAIN_WORKER_ID") == os.environ.get("FT_DIE_WORKER") \
            and _feeds == int(os.environ.get("FT_DIE_AFTER", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    until = os.environ.get("FT_FEED_DELAY_UNTIL")  # a test lifts the stand-in compute once its events are over
    delay = 0.0 if until and Path(until).exists() else float(os.environ.get("FT_FEED_DELAY", "0"))
    if delay:
        time.sleep(delay)  # stands in for a bigger model's compute
    _, labels = decode_digits(records)
    return {"id": torch.arange(metadata.start, metadata.end)}, torch.from_numpy(labels)
