"""The counting model (counting_digits.py) with ``record_batch = True``: ``feed`` gets a
``flextrain.data.RecordBatch`` and decodes it with ``records.array`` (a view of the reader's
decoded chunk), so exactly-once is checked on the zero-copy path. FT_FEED_DELAY / FT_FEED_DELAY_UNTIL as there."""

import numpy as np
import torch
from counting_digits import CONV, Model, delay_feed, eval_metrics_fn, loss, optimizer  # noqa: F401 (the contract)

from flextrain.data import RecordBatch, records_array

record_batch = True
DIGIT = np.dtype((np.uint8, 65))  # 64 pixels in 0..16, then the label


def feed(records, mode, metadata):
    if not isinstance(records, RecordBatch):  # the worker must hand this module a batch
        raise TypeError(f"feed got {type(records).__name__}, expected a RecordBatch")
    delay_feed()
    rows = records_array(records, DIGIT)
    x = torch.from_numpy(rows[:, :64].astype(np.float32) / np.float32(16))
    features = {"x": x.view(-1, 1, 8, 8) if CONV else x, "id": torch.arange(metadata.start, metadata.end)}
    return features, torch.from_numpy(rows[:, 64].astype(np.int64))
