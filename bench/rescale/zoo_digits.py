"""Model-zoo module for bench/rescale.py: the digits MLP with a step-recording optimizer.

The model, loss and feed of ``model_zoo/digits_torch.py`` (SGD with momentum), plus timing probes for the rescale benchmark:

* every committed optimizer step appends ``"<time.time()> <n>"`` (``n`` counts
  this process's steps from 1) to ``$RESCALE_DIR/steps-$FLEXTRAIN_WORKER_ID.txt``;
  the line is written right after ``super().step()`` returns, and flextrain
  calls ``optimizer.step()`` only for a step whose all-reduce succeeded, i.e. a
  committed step;
* importing the module in a worker writes the wall-clock time of the import to
  ``$RESCALE_DIR/import-$FLEXTRAIN_WORKER_ID.txt`` (the worker imports its
  module right after it registered with the master: a cross-check of the
  registration time parsed from the worker's log);
* building the optimizer writes ``"<start> <seconds>"`` of ``SGD.__init__`` to
  ``$RESCALE_DIR/optimizer-$FLEXTRAIN_WORKER_ID.txt`` (the first optimizer a
  process builds pays for torch's lazy imports).

Without both environment variables (e.g. in the master, which imports the
module only to check the contract) nothing is recorded.
"""

import importlib.util
import os
import time
from pathlib import Path

import torch

IMPORTED_AT = time.time()
_DIR = os.environ.get("RESCALE_DIR")
_WORKER = os.environ.get("FLEXTRAIN_WORKER_ID")

if _DIR and _WORKER:
    with open(os.path.join(_DIR, f"import-{_WORKER}.txt"), "w") as _f:
        _f.write(f"{IMPORTED_AT:.6f}\n")


def _load_zoo():
    """The model, loss and feed of model_zoo/digits_torch.py, so both benchmarks train the same thing."""
    path = Path(__file__).resolve().parents[2] / "model_zoo" / "digits_torch.py"
    spec = importlib.util.spec_from_file_location("_bench_digits_zoo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_zoo = _load_zoo()
Model, loss, feed = _zoo.Model, _zoo.loss, _zoo.feed


class StepRecordingSGD(torch.optim.SGD):
    """SGD with momentum that logs the wall-clock time of every step it applies."""

    def __init__(self, params, lr=0.1, momentum=0.9):
        started = time.time()
        super().__init__(params, lr=lr, momentum=momentum)
        took = time.time() - started
        self._steps = 0
        self._log = None
        if _DIR and _WORKER:
            with open(os.path.join(_DIR, f"optimizer-{_WORKER}.txt"), "w") as f:
                f.write(f"{started:.6f} {took:.6f}\n")
            self._log = open(os.path.join(_DIR, f"steps-{_WORKER}.txt"), "a", buffering=1)

    def step(self, closure=None):
        out = super().step(closure)
        self._steps += 1
        if self._log is not None:
            self._log.write(f"{time.time():.6f} {self._steps}\n")
        return out


def optimizer(params, lr=0.1):
    return StepRecordingSGD(params, lr=lr)

