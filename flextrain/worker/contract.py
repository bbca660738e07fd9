"""The vocabulary of the model-zoo module contract, shared by every framework's implementation.

The lowest floor of ``flextrain.worker``: the framework implementations (``pytorch``, ``tf/``)
import these names from here, never :mod:`flextrain.worker.module` (which finds them
through :mod:`flextrain.worker.frameworks`), so no import goes round in a circle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Mode(str, enum.Enum):
    """What ``feed`` is asked to prepare records for."""

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


class ModelDefError(ValueError):
    """The model-zoo module does not satisfy the contract."""


def raised(exc: BaseException) -> str:
    """``ValueError: bad shape``: a user's exception as a message names it."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def returned(value: Any) -> str:
    """What a user's function returned, for a message: ``None``, else its type (``list``, ``Tensor``)."""
    return "None" if value is None else type(value).__name__


class Framework(str, enum.Enum):
    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"


TF_INSTALL_HINT = "pip install 'flextrain[tensorflow]'"


@dataclass(frozen=True)
class FeedMetadata:
    """What ``feed`` is told about the records it gets."""

    source: str
    start: int
    end: int
    epoch: int


__all__ = ["FeedMetadata", "Framework", "Mode", "ModelDefError", "TF_INSTALL_HINT", "raised", "returned"]
