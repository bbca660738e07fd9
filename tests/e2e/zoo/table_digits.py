"""The digits classifier over a table: rows ``{"p0": .., ..., "p63": .., "label": ..}`` (flextrain.data.sql).

``columns`` names what ``feed`` needs, so the source reads only those columns (the test tables
carry an extra ``note`` column that is never read).
"""

import numpy as np
import torch

from digits_mlp import Model, eval_metrics_fn, loss, optimizer  # noqa: F401 (the module contract)

PIXELS = [f"p{i}" for i in range(64)]
columns = [*PIXELS, "label"]


def feed(records, mode, metadata):
    assert all(set(row) == set(columns) for row in records), "the source read columns feed did not ask for"
    x = torch.from_numpy(np.array([[row[p] for p in PIXELS] for row in records], dtype=np.float32) / 16.0)
    if mode == "prediction":
        return x
    return x, torch.tensor([row["label"] for row in records], dtype=torch.long)
