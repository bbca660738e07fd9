"""Importing the user's model-zoo module named by ``--model-def``: the one loader every process uses.

Workers (:mod:`flextrain.worker.module`) load the module to check the whole
contract and train; the master loads it only for the names it needs itself,
such as ``custom_data_reader`` (:func:`module_attribute`), so the loading
rules -- the spellings of ``--model-def``, the stable module name, the
ElasticDL ``Mode`` shim -- live here, below both. The contract's vocabulary
that those rules need (``Mode``, ``ModelDefError``) lives here too and is
re-exported by :mod:`flextrain.worker.contract`.

Spellings of ``--model-def``: ``path/to/module.py:Name``, ``pkg.module:Name``,
and the ElasticDL form ``pkg.module.Name`` (resolved against the current
directory, e.g. ``model_zoo.digits_torch.Model``).
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import os
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["Mode", "ModelDefError", "TF_INSTALL_HINT", "TF_PACKAGES", "raised", "returned", "top_level_imports",
           "install_elasticdl_shim", "split_spec", "import_target", "import_module_of", "module_attribute"]


class Mode(str, enum.Enum):
    """What ``feed`` is asked to prepare records for."""

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


class ModelDefError(ValueError):
    """The model-zoo module does not satisfy the contract."""


def raised(exc: BaseException) -> str:
    """``ValueError: bad shape``: a user's exception as a message names it."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def returned(value: Any) -> str:
    """What a user's function returned, for a message: ``None``, else its type (``list``, ``Tensor``)."""
    return "None" if value is None else type(value).__name__


TF_INSTALL_HINT = "pip install 'flextrain[tensorflow]'"
TF_PACKAGES = ("tensorflow", "keras", "tf_keras")

_ELASTICDL_CONSTANTS = "elasticdl.python.common.constants"


def install_elasticdl_shim() -> None:
    """Make ``from elasticdl.python.common.constants import Mode`` give flextrain's Mode.

    ElasticDL modules import it; they must run unchanged without an
    ``elasticdl`` package installed. A real installed package is left alone.
    """
    if _ELASTICDL_CONSTANTS in sys.modules or importlib.util.find_spec("elasticdl") is not None:
        return
    parts = _ELASTICDL_CONSTANTS.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        module = sys.modules.setdefault(name, ModuleType(name))
        module.__path__ = []  # a package, so the next level can be imported
        if i > 1:
            setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], module)
    sys.modules[_ELASTICDL_CONSTANTS].Mode = Mode


def split_spec(spec: str) -> tuple[str, str]:
    """``(module target, callable name)`` of a ``--model-def`` value."""
    if ":" in spec:
        target, name = spec.rsplit(":", 1)
    elif "." in spec and not spec.endswith(".py"):
        target, name = spec.rsplit(".", 1)
    else:
        raise ModelDefError(
            f"--model-def {spec!r} names no callable: use path/to/module.py:Name or package.module.Name"
        )
    if not target or not name or not name.isidentifier():
        raise ModelDefError(f"--model-def {spec!r} names no callable: use path/to/module.py:Name")
    return target, name


def import_target(target: str, spec: str) -> ModuleType:
    """Import the module part of ``spec`` (a file path, a dotted file under the working directory, a module)."""
    path = Path(target)
    # A slash or ".py" means a file path: never a module name to import (that read "No module named 'a/b'").
    path_like = target.endswith(".py") or "/" in target or os.sep in target
    if path.is_dir() and (path_like or not (path / "__init__.py").is_file()):  # a package is `pkg:Name`
        raise ModelDefError(f"--model-def {spec!r}: {target} is a directory, not a module file "
                            "(expected path/to/module.py:Name)")
    if path_like or path.is_file():
        if not path.is_file():
            raise ModelDefError(f"--model-def {spec!r}: module file {target} not found")
        return _import_file(path.resolve())
    dotted_file = Path(*target.split(".")).with_suffix(".py")
    if dotted_file.is_file():  # ElasticDL style: module path relative to the working directory
        return _import_file(dotted_file.resolve())
    try:
        return importlib.import_module(target)
    except (ImportError, TypeError) as exc:  # TypeError: a relative name such as ".models"
        raise_if_tf_missing(exc, target)
        raise ModelDefError(f"--model-def {spec!r}: cannot import module {target!r}: {exc}") from exc


def raise_if_tf_missing(exc: BaseException, where: str) -> None:
    missing = getattr(exc, "name", None) or ""
    if isinstance(exc, ImportError) and missing.split(".")[0] in TF_PACKAGES:
        raise ModelDefError(
            f"{where} is a TensorFlow module but TensorFlow is not installed "
            f"(import of {missing!r} failed); install it with: {TF_INSTALL_HINT}"
        ) from exc


def _import_file(path: Path) -> ModuleType:
    # The same name in every process (str hashes are salted per process): the module's classes are then
    # named alike everywhere, e.g. in the micro-batch probe's cache key (flextrain.elastic.probe.probe_key).
    name = f"flextrain_user_{path.stem}_{zlib.crc32(str(path).encode()) & 0xFFFFFF:x}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))  # sibling imports inside the model zoo
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise_if_tf_missing(exc, str(path))
        raise ModelDefError(f"{path}: importing the module failed: {exc!r}") from exc
    finally:
        sys.path.remove(str(path.parent))
    return module


def import_module_of(spec: str) -> tuple[ModuleType, str]:
    """The module named by ``--model-def spec`` (imported once per process) and the model callable's name."""
    target, name = split_spec(spec)
    install_elasticdl_shim()
    return import_target(target, spec), name


def module_attribute(spec: str, attribute: str) -> Any:
    """The module's ``attribute`` (None if it defines none): what the master needs of a module, e.g.
    ``custom_data_reader``, without the rest of the contract (the workers and submission check that).

    A module file whose source shows it cannot define ``attribute`` is not imported at all: the
    master of an ordinary job (most jobs) never runs the user's code nor imports its framework."""
    if _surely_lacks(spec, attribute):
        return None
    module, _ = import_module_of(spec)
    return getattr(module, attribute, None)


def module_columns(spec: str) -> tuple[str, ...] | None:
    """The module's ``columns`` (the table columns its ``feed`` reads): every Parquet file, and the table,
    must have them (flextrain.data.make_shards). None when it names none, or names something that is no
    list of column names (the module's own checks name that)."""
    names = module_attribute(spec, "columns")
    if isinstance(names, list | tuple) and names and all(isinstance(n, str) and n for n in names):
        return tuple(names)
    return None


_NO_FILE = object()  # _source_tree: the spec names a file that does not exist


def _source_tree(spec: str):
    """The parsed source of ``spec``'s module file: an ``ast.Module``, ``_NO_FILE`` when the spec names a
    file that is not there, None when it cannot be read without importing it (an installed module, bad
    source: the import names the problem)."""
    import ast

    try:
        target, _ = split_spec(spec)
    except ModelDefError:
        return None
    path = Path(target)
    if not path.is_file():
        if target.endswith(".py") or "/" in target or os.sep in target:
            return _NO_FILE
        dotted = Path(*target.split(".")).with_suffix(".py")
        if not dotted.is_file():
            return None
        path = dotted
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _surely_lacks(spec: str, attribute: str) -> bool:
    """True when ``spec``'s module is a file whose top level neither binds ``attribute`` nor star-imports
    (so importing it could not define it); False whenever that is not certain."""
    import ast

    tree = _source_tree(spec)
    if tree is _NO_FILE:
        return True  # nothing to find here (the workers' own loading names the problem)
    if tree is None:
        return False  # an installed module, or source that does not parse: import it to know
    for node in ast.walk(tree):  # any binding anywhere (a conditional def, globals(), setattr) counts
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return False
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == attribute:
            return False
        if isinstance(node, ast.Name) and node.id == attribute and isinstance(node.ctx, ast.Store):
            return False
        if isinstance(node, ast.alias) and (node.asname or node.name.rsplit(".", 1)[-1]) == attribute:
            return False
        if isinstance(node, ast.Constant) and node.value == attribute:  # setattr(..., "custom_data_reader", ...)
            return False
    return True


def top_level_imports(spec: str) -> frozenset[str]:
    """The packages ``spec``'s module file imports unconditionally at its top level (``import tensorflow as
    tf``, ``from keras import layers``: what importing the module surely loads); empty when its source
    cannot be read without importing it."""
    import ast

    tree = _source_tree(spec)
    if not isinstance(tree, ast.Module):
        return frozenset()
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return frozenset(names)
