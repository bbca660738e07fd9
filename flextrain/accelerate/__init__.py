"""``auto_accelerate``: ATorch's API for training optimizations, over flextrain's own methods.

A *strategy* is a list of optimization methods with configs (``parallel_mode``, ``amp_native``,
``half``, ``checkpoint``, ``zero1``, ``zero2``, ``fsdp``, ``fsdp2``, ``native_dynamo``,
``module_replace``, ``auto_ddp``, ``channels_last``, ``tf32``); ``auto_accelerate`` applies one
(semi-automatic mode) or chooses one by dry runs (fully automatic mode) and returns the model,
optimizer, data loader and functions for the user's ordinary training loop. See docs/accelerate.md.

Layout: :mod:`.api` (``auto_accelerate``), :mod:`.strategy` (``Strategy``, JSON),
:mod:`.methods` (the registry and methods), :mod:`.apply` (``apply_strategy``),
:mod:`.dryrun` (``dry_run``, ``compare``), :mod:`.search` (the fully automatic mode's search),
:mod:`.data` (loaders and input handling),
:mod:`.context` (``Inputs``, ``Context``, ``Report``).
"""

from __future__ import annotations

import importlib

from flextrain.accelerate.errors import AccelerateError, ConfigError, UnavailableMethodError, UnknownMethodError

# The rest is imported on first use (PEP 562): it needs torch, and the master (which only describes
# strategies, flextrain.accelerate.jobs) runs without importing it.
_LAZY = {
    "auto_accelerate": "api", "Applied": "apply", "AutoAccelerateResult": "apply", "apply_strategy": "apply",
    "Context": "context", "Inputs": "context", "Report": "context", "Skipped": "context",
    "Comparison": "dryrun", "DryRunResult": "dryrun", "compare": "dryrun", "dry_run": "dryrun",
    "plain_strategy": "dryrun", "sample_batches": "dryrun",
    "Method": "methods", "Phase": "methods", "get": "methods", "names": "methods", "register": "methods",
    "register_replace_pair": "methods",
    "Candidate": "results", "SearchResult": "results", "search": "search",
    "Step": "strategy", "Strategy": "strategy", "conflict": "strategy",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # All at once, in the eager order's effect: the function ``search`` replaces the submodule of that name
    for lazy, module in _LAZY.items():
        globals()[lazy] = getattr(importlib.import_module(f"{__name__}.{module}"), lazy)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["AccelerateError", "Applied", "AutoAccelerateResult", "Candidate", "Comparison", "ConfigError", "Context",
           "DryRunResult", "Inputs", "Method", "Phase", "Report", "SearchResult", "Skipped", "Step", "Strategy",
           "UnavailableMethodError", "UnknownMethodError", "apply_strategy", "auto_accelerate", "compare",
           "conflict", "dry_run", "get", "names", "plain_strategy", "register", "register_replace_pair",
           "sample_batches", "search"]
