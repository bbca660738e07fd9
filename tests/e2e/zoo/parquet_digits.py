"""The digits classifier of model_zoo/digits_torch.py, fed from Parquet rows.

The training and validation data are Parquet files with the columns
``pixels`` (a list of 64 float32 values in [0, 1]) and ``label`` (int64).
Each record ``feed`` gets is one row as a dict, column name -> Python value.
``columns`` names the columns ``feed`` needs, so only those are read.
"""

import numpy as np
import torch

from digits_mlp import Model, eval_metrics_fn, loss, optimizer  # noqa: F401 (the module contract)

columns = ["pixels", "label"]


def feed(records, mode, metadata):
    features = torch.from_numpy(np.array([row["pixels"] for row in records], dtype=np.float32).reshape(-1, 64))
    if mode == "prediction":
        return features
    return features, torch.tensor([row["label"] for row in records], dtype=torch.int64)
