"""The digits model zoo module with a fixed extra cost per training batch.

A stand-in for a model big enough that pods come and go *during* training:
on this machine the plain digits model finishes an epoch faster than a new
worker process starts. ``feed`` costs ``FT_SLOW_FEED_SECONDS`` (default 0.05)
more per call in training mode, until the file ``FT_SLOW_FEED_UNTIL`` names exists (a test lifts
the delay once its events are over: the rest trains at full speed); everything else is
model_zoo/digits_torch.py.
"""

import importlib.util
import os
import time
from pathlib import Path

_path = Path(__file__).resolve().parents[4] / "model_zoo" / "digits_torch.py"
_spec = importlib.util.spec_from_file_location("flextrain_test_digits_torch", _path)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

Model = _base.Model
loss = _base.loss
optimizer = _base.optimizer
eval_metrics_fn = _base.eval_metrics_fn
DELAY = float(os.environ.get("FT_SLOW_FEED_SECONDS", "0.05"))
UNTIL = os.environ.get("FT_SLOW_FEED_UNTIL")


def feed(records, mode, metadata):
    if mode == "training" and not (UNTIL and Path(UNTIL).exists()):
        time.sleep(DELAY)
    return _base.feed(records, mode, metadata)
