"""The errors of :mod:`flextrain.accelerate`: each names the argument (or method) at fault.

All are ``ValueError`` subclasses, so code that catches bad arguments in general still does.
"""

from __future__ import annotations


class AccelerateError(ValueError):
    """An argument of ``auto_accelerate`` (or of a strategy) that cannot work; the message names it."""


class UnknownMethodError(AccelerateError):
    """A strategy names an optimization method that is not registered."""


class ConfigError(AccelerateError):
    """A method's config has the wrong shape or a value it cannot take."""


class UnavailableMethodError(AccelerateError):
    """A method asked for explicitly cannot apply here (its ``check`` gave the reason)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"load_strategy asks for {name!r}, which cannot apply here: {reason} "
                         "(pass skip_unavailable=True to skip such methods and list them in the report)")
        self.name, self.reason = name, reason


__all__ = ["AccelerateError", "ConfigError", "UnavailableMethodError", "UnknownMethodError"]
