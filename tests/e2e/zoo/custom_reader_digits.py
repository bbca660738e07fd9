"""The digits classifier, reading its data itself through an ElasticDL-style ``custom_data_reader``.

``data_origin`` (``--training-data`` / ``--validation-data``) is an ``.npz`` file with
``pixels`` (n, 64) float32 in [0, 1] and ``labels`` (n,) int64. ``create_shards()`` cuts
it into ``SHARDS`` shards named ``digits:0`` .. ``digits:3`` -- names that are no files:
only this reader knows them. ``read_records(task)`` gives one ``(pixels, label)`` pair per
record of the task's range, and ``feed`` stacks them into tensors.

FT_READER_FAIL=create_shards|read_records: that call raises (the tests of how a failing
reader is reported).
"""

import os

import numpy as np
import torch

from digits_mlp import Model, eval_metrics_fn, loss, optimizer  # noqa: F401 (the module contract)

SHARDS = 4


def feed(records, mode, metadata):
    features = torch.from_numpy(np.stack([pixels for pixels, _ in records]).astype(np.float32))
    if mode == "prediction":
        return features
    return features, torch.tensor([label for _, label in records], dtype=torch.int64)



class NpzDigitsReader:
    def __init__(self, path, records_per_task=None):
        with np.load(path) as data:
            self.pixels, self.labels = data["pixels"], data["labels"]
        self.records_per_task = records_per_task
        n = len(self.labels)
        bounds = [n * k // SHARDS for k in range(SHARDS + 1)]
        self.ranges = {f"digits:{k}": (bounds[k], bounds[k + 1]) for k in range(SHARDS)}

    def create_shards(self):
        if os.environ.get("FT_READER_FAIL") == "create_shards":
            raise ConnectionError("the digits service refused the connection")
        return {name: (0, hi - lo) for name, (lo, hi) in self.ranges.items()}

    def read_records(self, task):
        if os.environ.get("FT_READER_FAIL") == "read_records":
            raise ConnectionError(f"lost the digits service reading {task.shard_name}")
        offset = self.ranges[task.shard_name][0]
        for i in range(offset + task.start, offset + task.end):
            yield self.pixels[i], int(self.labels[i])


def custom_data_reader(data_origin, records_per_task=None, **kwargs):
    return NpzDigitsReader(data_origin, records_per_task)
