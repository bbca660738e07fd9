"""The counting model (counting_digits.py) reading its records through a ``custom_data_reader``.

``data_origin`` is an ``.npz`` file with ``pixels`` (n, 64), ``labels`` (n,) and ``ids`` (n,);
the shards are ``count:0``, ``count:1``, ... of ``SHARD_RECORDS`` records each (the last
may be shorter), and each record is the row dict (``id``, ``pixels``, ``label``) the
counting model's ``feed`` takes, so the final checkpoint counts every record applied.
"""

import numpy as np
from counting_digits import Model, eval_metrics_fn, feed, loss, optimizer  # noqa: F401 (the module's contract)

SHARD_RECORDS = 128  # 4 global batches of 32: every step is a full G


class CountingReader:
    def __init__(self, path):
        with np.load(path) as data:
            self.pixels, self.labels, self.ids = data["pixels"], data["labels"], data["ids"]

    def create_shards(self):
        n = len(self.ids)
        return [(f"count:{k}", 0, min(SHARD_RECORDS, n - lo)) for k, lo in enumerate(range(0, n, SHARD_RECORDS))]

    def read_records(self, task):
        offset = int(task.shard_name.split(":")[1]) * SHARD_RECORDS
        return [{"id": int(self.ids[i]), "pixels": self.pixels[i].tolist(), "label": int(self.labels[i])}
                for i in range(offset + task.start, offset + task.end)]


def custom_data_reader(data_origin, records_per_task=None, **kwargs):
    return CountingReader(data_origin)
