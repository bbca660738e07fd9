"""The vocabulary of the model-zoo module contract, shared by every framework's implementation.

The lowest floor of ``flextrain.worker``: the framework implementations (``pytorch``, ``tf/``)
import these names from here, never :mod:`flextrain.worker.module` (which finds them
through :mod:`flextrain.worker.frameworks`), so no import goes round in a circle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# The loader's vocabulary lives below both master and worker (the master loads a module for its
# custom_data_reader); re-exported here, where the worker has always found it.
from flextrain.job.usermodule import TF_INSTALL_HINT, Mode, ModelDefError, raised, returned


class Framework(str, enum.Enum):
    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"


@dataclass(frozen=True)
class FeedMetadata:
    """What ``feed`` is told about the records it gets."""

    source: str
    start: int
    end: int
    epoch: int


__all__ = ["FeedMetadata", "Framework", "Mode", "ModelDefError", "TF_INSTALL_HINT", "raised", "returned"]
