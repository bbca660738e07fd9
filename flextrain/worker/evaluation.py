"""Evaluation tasks: per-sample metric sums over a record range.

``eval_metrics_fn()`` maps names to ``fn(labels, predictions)`` returning
per-sample values; a worker reports, per metric, the sum of those values and
the number of samples, and the master divides the totals: the metric is the
mean over every evaluated sample however the tasks were spread.
"""

from __future__ import annotations

import torch

from flextrain.data import read_shard_range
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.module import FeedMetadata, Mode, ModelDef, ModelDefError
from flextrain.worker.trainer import feed_tensors, take


def evaluate_task(model_def: ModelDef, model: torch.nn.Module, task: pb.Task, *,
                  batch_size: int) -> tuple[dict[str, float], int]:
    records = read_shard_range(task.source, task.start, task.end)
    meta = FeedMetadata(task.source, task.start, task.end, task.epoch)
    features, labels = feed_tensors(model_def, records, Mode.EVALUATION, meta)
    metrics = model_def.metric_fns()
    sums = {name: 0.0 for name in metrics}
    model.eval()
    with torch.no_grad():
        for lo in range(0, len(records), batch_size):
            sl = slice(lo, min(lo + batch_size, len(records)))
            predictions = model(take(features, sl))
            for name, fn in metrics.items():
                values = torch.as_tensor(fn(take(labels, sl), predictions))
                if values.numel() != sl.stop - sl.start:
                    raise ModelDefError(
                        f"{model_def.path}: metric {name!r} returned {values.numel()} values for "
                        f"{sl.stop - sl.start} samples; it must return one value per sample"
                    )
                sums[name] += float(values.double().sum())
    return sums, len(records)
