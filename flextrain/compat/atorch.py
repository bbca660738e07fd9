"""ATorch's import path: ``from flextrain.compat.atorch import auto_accelerate`` for
``from atorch.auto import auto_accelerate`` (or ``atorch.auto.accelerate``).

``auto_accelerate`` and ``Strategy`` are flextrain's own (:mod:`flextrain.accelerate`), so an
ATorch script runs with only the import changed; ``register_replace_pair`` is ATorch's
``atorch.auto.opt_lib.module_replace_optimization.register_replace_pair``. Differences from
ATorch (docs/accelerate.md): strategies are saved as JSON, not pickle; only data parallelism
(no tensor/pipeline parallel, DeepSpeed or fairscale); FSDP1 needs CUDA (``fsdp2`` runs on CPU).
"""

from __future__ import annotations

from flextrain.accelerate import AutoAccelerateResult, Strategy, auto_accelerate, register_replace_pair

__all__ = ["AutoAccelerateResult", "Strategy", "auto_accelerate", "register_replace_pair"]
