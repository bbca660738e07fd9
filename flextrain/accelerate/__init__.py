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

from flextrain.accelerate.api import auto_accelerate
from flextrain.accelerate.apply import Applied, AutoAccelerateResult, apply_strategy
from flextrain.accelerate.context import Context, Inputs, Report, Skipped
from flextrain.accelerate.dryrun import Comparison, DryRunResult, compare, dry_run, plain_strategy, sample_batches
from flextrain.accelerate.errors import AccelerateError, ConfigError, UnavailableMethodError, UnknownMethodError
from flextrain.accelerate.methods import Method, Phase, get, names, register, register_replace_pair
from flextrain.accelerate.results import Candidate, SearchResult
from flextrain.accelerate.search import search
from flextrain.accelerate.strategy import Step, Strategy, conflict

__all__ = ["AccelerateError", "Applied", "AutoAccelerateResult", "Candidate", "Comparison", "ConfigError", "Context",
           "DryRunResult", "Inputs", "Method", "Phase", "Report", "SearchResult", "Skipped", "Step", "Strategy",
           "UnavailableMethodError", "UnknownMethodError", "apply_strategy", "auto_accelerate", "compare",
           "conflict", "dry_run", "get", "names", "plain_strategy", "register", "register_replace_pair",
           "sample_batches", "search"]
