"""``aikit.elastic.TF``: ``init(global_batch_size, max_gpu_batch_size)`` and ``model.Model``, over
:mod:`flextrain.elastic.keras` (imported, with TensorFlow, when first used)."""

from __future__ import annotations

import importlib
from typing import Any


def init(global_batch_size: int, max_gpu_batch_size: int | None = None, *,
         max_micro_batch: int | None = None) -> Any:
    """:func:`flextrain.elastic.keras.init`; the values appear on ``aikit.elastic`` as for Torch."""
    from flextrain.elastic import keras

    return keras.init(global_batch_size, max_gpu_batch_size, max_micro_batch=max_micro_batch)


def __getattr__(name: str) -> Any:
    if name == "model":
        return importlib.import_module(f"{__name__}.model")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["init"]
