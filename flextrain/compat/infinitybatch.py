"""infinitybatch's import path: ``from flextrain.compat import infinitybatch`` for ``import infinitybatch``.

``infinitybatch.InfinityBatch()`` is :class:`flextrain.elastic.infinity.InfinityBatch`, which
accepts the reference's attributes and calls as written (``ib.optimier`` included, the spelling
of its README) and bounds device memory for real (docs/infinity-batch.md).
"""

from __future__ import annotations

from flextrain.elastic.ib_events import Callback, LoopWarning
from flextrain.elastic.infinity import GhostBatchWarning, InfinityBatch

__all__ = ["Callback", "GhostBatchWarning", "InfinityBatch", "LoopWarning"]
