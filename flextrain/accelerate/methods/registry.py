"""Methods by name: ``register`` adds one, ``get`` finds one (aliases too), ``names`` lists them.

The registry imports no method: :mod:`flextrain.accelerate.methods` imports the built-in ones,
which register themselves; a user's own method registers the same way::

    from flextrain.accelerate import Method, Phase, register

    @register
    class Freeze(Method):
        name, phase = "freeze_embeddings", Phase.CAST
        def apply(self, ctx, config): ctx.model.embed.requires_grad_(False)
"""

from __future__ import annotations

import difflib

from flextrain.accelerate.errors import UnknownMethodError
from flextrain.accelerate.methods.base import Method

_methods: dict[str, Method] = {}
_aliases: dict[str, str] = {}


def register(method: Method | type[Method], *, replace: bool = False) -> Method | type[Method]:
    """Register a method (an instance, or a class made with no arguments); usable as a decorator.
    A name or alias taken already raises ValueError unless ``replace``."""
    instance = method() if isinstance(method, type) else method
    if not isinstance(instance, Method):
        raise TypeError(f"register takes a Method subclass or instance, got {type(instance).__name__}")
    names = (instance.name, *instance.aliases)
    for n in names:
        taken = _aliases.get(n)
        if taken is not None and not replace:
            raise ValueError(f"optimization method name {n!r} is taken by {taken!r} (pass replace=True to replace it)")
    _methods[instance.name] = instance
    for n in names:
        _aliases[n] = instance.name
    return method


def canonical_name(name: object, *, argument: str = "load_strategy") -> str:
    """The registered name for ``name`` or one of its aliases; UnknownMethodError otherwise."""
    if not isinstance(name, str):
        raise UnknownMethodError(f"{argument}: a method name must be a string, got {name!r}")
    found = _aliases.get(name)
    if found is None:
        close = difflib.get_close_matches(name, list(_aliases), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownMethodError(f"{argument}: unknown optimization method {name!r}{hint} "
                                 f"(known: {', '.join(names())})")
    return found


def get(name: str, *, argument: str = "load_strategy") -> Method:
    """The registered method called ``name`` (or an alias of it)."""
    return _methods[canonical_name(name, argument=argument)]


def names() -> tuple[str, ...]:
    """Registered method names, sorted (aliases not included)."""
    return tuple(sorted(_methods))


__all__ = ["canonical_name", "get", "names", "register"]
