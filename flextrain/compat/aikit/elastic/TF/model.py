"""``aikit.elastic.TF.model.Model(model)``: :class:`flextrain.elastic.keras.Model`."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Model":
        from flextrain.elastic import keras

        return keras.Model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
