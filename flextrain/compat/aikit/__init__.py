"""AIkit's ``aikit`` package: ``aikit.elastic`` (init and the plan's values) and ``aikit.ga`` (GA
optimizers), backed by :mod:`flextrain.elastic.torch` and :mod:`flextrain.elastic.keras`.

TensorFlow is imported only when a TF name is used (``aikit.elastic.TF``, ``aikit.elastic.models``),
so PyTorch scripts run without it.
"""

from flextrain.compat.aikit import elastic, ga

__all__ = ["elastic", "ga"]
