"""Strategy configs to JSON and back: plain values as JSON, classes by import path, never pickle or eval.

A config may hold, besides JSON's own values, module classes (``checkpoint``'s
``wrap_class``, ``fsdp``'s ``atorch_wrap_cls``), torch dtypes and tuples. They are
written as one-key objects::

    {"__class__": "my_model:Block"}      a class, by "module:QualName"
    {"__dtype__": "bfloat16"}            a torch dtype
    tuples                               JSON lists (each method's validate() turns them back)

Reading a class back imports nothing but torch's own modules: a class of any other module
is found only when that module is already imported (the user's code that builds the
model has imported it), so a strategy file cannot make this process import or run code.
"""

from __future__ import annotations

import enum
import importlib
import sys
from typing import TYPE_CHECKING, Any

from flextrain.accelerate.errors import ConfigError

if TYPE_CHECKING:
    import torch

_CLASS, _DTYPE = "__class__", "__dtype__"


def class_path(cls: type) -> str:
    """``"module:QualName"`` of a class that can be found again by that path (not a local class)."""
    qual = cls.__qualname__
    if "<locals>" in qual:
        raise ConfigError(f"class {qual} is defined inside a function: a strategy saved as JSON names classes by "
                          "import path, so define it at module level (or name it by its class name, a string)")
    return f"{cls.__module__}:{qual}"


def _torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def resolve_class(path: str, *, what: str = "strategy") -> type:
    """The class at ``"module:QualName"``: torch's modules are imported on demand, others must be
    imported already. Raises ConfigError naming ``what`` otherwise."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise ConfigError(f"{what}: {path!r} is not a class path 'module:QualName'")
    module_name, qual = path.split(":")
    parts = qual.split(".")
    if not module_name or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise ConfigError(f"{what}: {path!r} is not a class path 'module:QualName'")
    module = sys.modules.get(module_name)
    if module is None and _torch_module(module_name):
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"{what}: cannot import {module_name} for class {path!r}: {e}") from None
    if module is None:
        raise ConfigError(f"{what} names class {path!r}, but module {module_name!r} is not imported: import it "
                          "before loading the strategy (flextrain imports only torch's modules for a strategy)")
    obj: Any = module
    for part in parts:
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"{what}: module {module_name!r} has no {qual!r} (from {path!r})")
    if not isinstance(obj, type):
        raise ConfigError(f"{what}: {path!r} is a {type(obj).__name__}, not a class")
    return obj


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode(value: Any, *, where: str = "config") -> Any:
    """A JSON-able copy of a config value (see the module docstring)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    torch = sys.modules.get("torch")  # no torch imported, no torch dtype to meet (the master runs without it)
    if torch is not None and isinstance(value, torch.dtype):
        return {_DTYPE: _dtype_name(value)}
    if isinstance(value, type):
        return {_CLASS: class_path(value)}
    if isinstance(value, list | tuple):
        return [encode(v, where=where) for v in value]
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{where}: only string keys can be saved as JSON, got {bad[0]!r}")
        return {k: encode(v, where=f"{where}[{k!r}]") for k, v in value.items()}
    raise ConfigError(f"{where}: a {type(value).__name__} ({value!r}) cannot be saved in a JSON strategy "
                      "(plain values, module classes and torch dtypes can)")


def decode(value: Any, *, where: str = "strategy") -> Any:
    """The config value :func:`encode` wrote (lists stay lists; classes are resolved as above)."""
    if isinstance(value, list):
        return [decode(v, where=where) for v in value]
    if isinstance(value, dict):
        if set(value) == {_CLASS}:
            return resolve_class(value[_CLASS], what=where)
        if set(value) == {_DTYPE}:
            import torch

            dtype = getattr(torch, str(value[_DTYPE]), None)
            if not isinstance(dtype, torch.dtype):
                raise ConfigError(f"{where}: {value[_DTYPE]!r} is not a torch dtype")
            return dtype
        return {k: decode(v, where=where) for k, v in value.items()}
    return value


__all__ = ["class_path", "decode", "encode", "resolve_class"]
