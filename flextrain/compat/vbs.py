"""elastic-learning-rate-evaluation's ``variable_batch_size`` module: ``import flextrain.compat.vbs as vbs``.

``vbs.CustomSampler`` is :class:`flextrain.elastic.torch.TraceBatchSampler` with the reference's
signature and defaults (``dataset`` first, ``seed=42``, ``minibatch_size=32``; ``dataset_size=``
instead of a dataset also works); the optimizers are flextrain's rule optimizers, whose
signature ``(internal_optimizer, sampler, ref_batchsize, log_steps=None)`` is the reference's.
What differs from the reference (docs/elastic-scripts.md, "Batch-size schedules and LR rules"):
the samples an epoch's last step cannot fill make a partial step instead of being dropped; the
trace may end before training does (its last size holds); a size must be a multiple of
``minibatch_size x num_replicas``; the all-reduce is torch.distributed's (gloo/NCCL), not XLA's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flextrain.elastic.rules import AdaScaleOptimizer, LinearRuleOptimizer, RootRuleOptimizer, SqrtRuleOptimizer
from flextrain.elastic.trace_sampler import TraceBatchSampler

log = logging.getLogger(__name__)


class CustomSampler(TraceBatchSampler):
    """The reference's sampler: ``CustomSampler(dataset, trace, seed=42, num_replicas=None,
    rank=None, minibatch_size=32, verbose=True)``, or ``dataset_size=`` for ``dataset``."""

    def __init__(self, dataset: Any = None, trace: str | Path | Sequence[int] | int | None = None, seed: int = 42,
                 num_replicas: int | None = None, rank: int | None = None, minibatch_size: int = 32,
                 verbose: bool = True, *, dataset_size: int | None = None) -> None:
        if dataset_size is None:
            if dataset is None:
                raise TypeError("CustomSampler needs dataset= (a Dataset) or dataset_size=")
            dataset_size = len(dataset)
        elif dataset is not None and len(dataset) != dataset_size:
            raise ValueError(f"dataset has {len(dataset)} samples but dataset_size={dataset_size}")
        if trace is None:
            raise TypeError("CustomSampler needs trace= (a CSV path 'step,batchsize', a list of sizes or an int)")
        super().__init__(dataset_size, trace, num_replicas, rank, minibatch_size=minibatch_size, seed=seed)
        self.verbose = verbose
        if verbose and self.rank == 0:
            sizes = self.schedule.sizes
            log.info("CustomSampler: trace %s starting with %s over %d step(s), then %d; %d sample(s), "
                     "%d replica(s) x minibatch %d", self.schedule.source, list(sizes[:3]), len(sizes), sizes[-1],
                     dataset_size, self.num_replicas, self.minibatch_size)


__all__ = ["AdaScaleOptimizer", "CustomSampler", "LinearRuleOptimizer", "RootRuleOptimizer", "SqrtRuleOptimizer"]
