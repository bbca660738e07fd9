"""``aikit.elastic``: ``Torch.init(G, M)`` / ``TF.init(G, M)`` and the values they computed.

``steps``, ``batch_size``, ``global_batch_size``, ``gpus``, ``master`` (and flextrain's other
plan attributes, :data:`flextrain.elastic.session.ATTRIBUTES`) are read from the Session of the
latest ``init`` of either framework (:func:`flextrain.elastic.session.current`); None before one ran.
"""

from __future__ import annotations

import importlib
from typing import Any

from flextrain.compat.aikit.elastic import Torch
from flextrain.elastic.session import ATTRIBUTES, current

_LAZY = ("TF", "models")  # need TensorFlow: imported on first use


def __getattr__(name: str) -> Any:
    if name in ATTRIBUTES:
        planned = current()
        return None if planned is None else planned.attributes()[name]
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *ATTRIBUTES, *_LAZY})


__all__ = ["Torch", *ATTRIBUTES]
