"""Value types of a PS shard's contract: sync settings, push results, the precondition error.

Kept apart from :mod:`flextrain.ps.state` (the rules) so the write-ahead log
and the gRPC layer can name them without the shard's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass


class PreconditionError(RuntimeError):
    """The request is well-formed but the PS is not in a state to serve it."""


@dataclass(frozen=True)
class SyncSettings:
    mode: str = "sync"          # "sync" | "async"
    grads_to_wait: int = 1
    version_tolerance: int = 0
    staleness_lr: bool = False
    max_staleness: int = 0

    def validated(self) -> "SyncSettings":
        if self.mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {self.mode!r}")
        if self.grads_to_wait < 1:
            raise ValueError(f"grads_to_wait must be >= 1, got {self.grads_to_wait}")
        if self.version_tolerance < 0 or self.max_staleness < 0:
            raise ValueError("version_tolerance and max_staleness must be >= 0")
        return self


@dataclass(frozen=True)
class PushResult:
    accepted: bool
    version: int
    message: str = ""
    applied: bool = False
    duplicate: bool = False  # the minibatch was accepted before: nothing done
