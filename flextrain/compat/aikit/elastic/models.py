"""``aikit.elastic.models.Model(model)`` (the README's spelling of ``TF.model.Model``):
:class:`flextrain.elastic.keras.Model`."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Model":
        from flextrain.elastic import keras

        return keras.Model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
