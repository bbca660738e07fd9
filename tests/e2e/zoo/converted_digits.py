"""The digits classifier over records written by `flextrain data convert` from a CSV (p0..p63, label).

``feed`` decodes them with ``flextrain.data.rows.decode_rows`` and the schema
written beside the shards (found from the shard's path in ``metadata``).
"""

import functools
import os

import numpy as np
import torch

from flextrain.data.rows import decode_rows, load_schema

from digits_mlp import Model, eval_metrics_fn, loss, optimizer  # noqa: F401 (the module contract)

PIXELS = [f"p{i}" for i in range(64)]


@functools.lru_cache(maxsize=8)
def schema_of(directory: str):
    return load_schema(directory)


def feed(records, mode, metadata):
    columns = decode_rows(records, schema_of(os.path.dirname(metadata.source)))
    pixels = np.stack([columns[name] for name in PIXELS], axis=1).astype(np.float32) / 16
    features = torch.from_numpy(pixels)
    if mode == "prediction":
        return features
    return features, torch.from_numpy(columns["label"].astype(np.int64))
