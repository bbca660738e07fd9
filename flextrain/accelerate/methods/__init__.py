"""The optimization methods: the registry and the built-in methods, which register themselves here.

``get(name)`` finds one (aliases too), ``names()`` lists them, ``register`` adds your own; see
:mod:`flextrain.accelerate.methods.base` for what a method is.
"""

from __future__ import annotations

from flextrain.accelerate.methods import compute, parallel, precision, replace, sharding
from flextrain.accelerate.methods.base import Method, Phase
from flextrain.accelerate.methods.registry import canonical_name, get, names, register
from flextrain.accelerate.methods.replace import register_replace_pair

# Importing them registers the built-in methods.
BUILTIN_MODULES = (compute, parallel, precision, replace, sharding)

__all__ = ["BUILTIN_MODULES", "Method", "Phase", "canonical_name", "get", "names", "register", "register_replace_pair"]
