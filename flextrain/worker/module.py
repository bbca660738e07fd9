"""Loading a model-zoo module and checking it against the module contract.

The contract (DESIGN.md, "Model-zoo module contract"): a zero-argument model
callable named by ``--model-def``, ``loss(labels, predictions)``,
``optimizer(params, lr=...)`` (TensorFlow: ``optimizer(lr=...)``),
``feed(records, mode, metadata)`` (alias ``dataset_fn``), and optionally
``eval_metrics_fn()``, ``callbacks()`` and ``custom_data_reader(data_origin, ...)``
(the module reads its own data: :mod:`flextrain.data.custom`, :mod:`flextrain.worker.reading`).

Framework: a module that imports ``tensorflow`` or ``keras`` (and not
``torch``) is a TensorFlow module; one that imports ``torch`` (and not TF) is a
PyTorch module; otherwise the optimizer decides (``optimizer(lr=...)`` with no
positional parameter: TensorFlow). TensorFlow modules follow the ElasticDL
contract: the model callable returns a ``tf.keras.Model``, ``optimizer(lr=...)``
returns a Keras optimizer, and ``feed(dataset, mode, metadata)`` maps a
``tf.data.Dataset`` of raw records to per-record ``(features, labels)``
(``flextrain.worker.tf``). TensorFlow is an optional extra: a TensorFlow module
loaded without it is a :class:`ModelDefError` saying how to install it.

``load_model_def`` runs at submission (``flextrain train`` checks before any
process starts) and again in every worker; a missing or mis-shaped piece is a
:class:`ModelDefError` that names the module and the piece.

Spellings of ``--model-def``: ``path/to/module.py:Name``, ``pkg.module:Name``,
and the ElasticDL form ``pkg.module.Name`` (resolved against the current
directory, e.g. ``model_zoo.digits_torch.Model``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from flextrain.elastic.metrics import AUC, MergeableMetric
from flextrain.job.usermodule import TF_PACKAGES as _TF_PACKAGES
from flextrain.job.usermodule import import_module_of
from flextrain.worker.contract import (TF_INSTALL_HINT, FeedMetadata, Framework, Mode,  # noqa: F401 (re-exported)
                                      ModelDefError, raised, returned)

@dataclass(frozen=True)
class ModelDef:
    spec: str
    module: ModuleType
    model_fn: Callable[[], Any]
    loss: Callable
    optimizer: Callable
    feed: Callable
    eval_metrics_fn: Callable | None
    callbacks: Callable | None
    framework: Framework = Framework.PYTORCH
    #: ElasticDL's ``custom_data_reader(data_origin, records_per_task=None, **kwargs)``: the module reads
    #: its own data (flextrain.data.custom); None: flextrain's sources read the data path.
    custom_data_reader: Callable | None = None

    @property
    def path(self) -> str:
        return getattr(self.module, "__file__", self.module.__name__)

    @property
    def model_name(self) -> str:
        """The model callable's name (``Model`` of ``path/to/module.py:Model``)."""
        return self.spec.rsplit(":", 1)[-1] if ":" in self.spec else self.spec.rsplit(".", 1)[-1]

    @property
    def columns(self) -> tuple[str, ...] | None:
        """The module's ``columns``: the table columns ``feed`` needs (Parquet and SQL sources read
        only those); None reads every column."""
        names = getattr(self.module, "columns", None)
        return None if names is None else tuple(names)

    @property
    def record_batch(self) -> bool:
        """The module's ``record_batch = True``: ``feed`` gets a :class:`flextrain.data.RecordBatch`
        (no ``bytes`` object per record; ``records.array(dtype)`` views the decoded data) instead
        of a list of ``bytes``."""
        return getattr(self.module, "record_batch", False) is True

    def build_model(self):
        """Call the model callable and check what it returned (preflight and every worker do)."""
        from flextrain.worker.frameworks import support

        call = f"{self.model_name}()"
        try:
            model = self.model_fn()
        except Exception as exc:
            raise ModelDefError(f"{self.path}: the model callable {call} raised {raised(exc)}") from exc
        return support(self.framework).check_model(model, where=f"{self.path}: the model callable {call}")

    def build_optimizer(self, model, lr: float | None):
        """Call ``optimizer`` for ``model`` and check it returned an optimizer (preflight and every worker do)."""
        from flextrain.worker.frameworks import support

        kwargs = {} if lr is None else {"lr": lr}
        return support(self.framework).build_optimizer(self.optimizer, model, kwargs, where=self.path)

    def metric_fns(self) -> dict[str, Callable | MergeableMetric]:
        """``eval_metrics_fn()``: name -> per-sample ``fn(labels, predictions)`` or a fresh
        :class:`MergeableMetric` (a Keras ``AUC`` object becomes flextrain's)."""
        if self.eval_metrics_fn is None:
            return {}
        metrics = self.eval_metrics_fn()
        if not isinstance(metrics, dict):
            raise ModelDefError(
                f"{self.path}: eval_metrics_fn() must return a dict of name -> fn(labels, predictions), "
                f"got {type(metrics).__name__}"
            )
        return {name: _metric(self.path, name, m) for name, m in metrics.items()}


def _metric(where: str, name: str, m):
    if isinstance(m, MergeableMetric):
        m.reset()
        return m
    if hasattr(m, "update_state") and hasattr(m, "result"):  # a Keras metric object
        if type(m).__name__ == "AUC" and str(getattr(m, "curve", "ROC")).upper().endswith("ROC"):
            return AUC(from_logits=bool(getattr(m, "_from_logits", False)))  # ElasticDL modules use it
        raise ModelDefError(
            f"{where}: eval_metrics_fn()[{name!r}] is a {type(m).__module__}.{type(m).__name__} object; "
            f"metrics are aggregated over workers, so give a per-sample fn(labels, predictions) (averaged) "
            f"or a flextrain.elastic.metrics metric such as AUC (tf.keras.metrics.AUC of the ROC curve is translated)"
        )
    if not callable(m):
        raise ModelDefError(f"{where}: eval_metrics_fn()[{name!r}] is a {type(m).__name__}, not a "
                            f"fn(labels, predictions) or a flextrain.elastic.metrics metric")
    return m


def _framework(module: ModuleType, optimizer: Callable) -> Framework:
    """TensorFlow if the module imported TF/Keras and not torch; torch conversely; else by signature."""
    roots = set()
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str):
            roots.add(name.split(".")[0])
    uses_tf, uses_torch = bool(roots & set(_TF_PACKAGES)), "torch" in roots
    if uses_tf != uses_torch:
        return Framework.TENSORFLOW if uses_tf else Framework.PYTORCH
    return Framework.TENSORFLOW if _positional_arity(optimizer)[0] == 0 else Framework.PYTORCH


def _positional_arity(fn: Callable) -> tuple[int, int, bool]:
    """(required positional, max positional, has **kwargs)"""
    sig = inspect.signature(fn)
    required = maximum = 0
    var_kw = False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            maximum += 1
            required += p.default is p.empty
        elif p.kind is p.VAR_POSITIONAL:
            maximum = 1 << 30
        elif p.kind is p.VAR_KEYWORD:
            var_kw = True
    return required, maximum, var_kw


def _require(module: ModuleType, where: str, name: str, usage: str, nargs: int | None, *aliases: str) -> Callable:
    """The module's callable ``name`` (or an alias); with ``nargs``, it must take that many positionals."""
    for candidate in (name, *aliases):
        fn = getattr(module, candidate, None)
        if fn is not None:
            break
    else:
        raise ModelDefError(f"{where} defines no `{name}` (required: {usage})")
    if not callable(fn):
        raise ModelDefError(f"{where}: `{candidate}` must be a function {usage}, got {type(fn).__name__}")
    required, maximum, _ = _positional_arity(fn)
    if nargs is not None and not required <= nargs <= maximum:
        raise ModelDefError(
            f"{where}: `{candidate}` has the wrong signature {candidate}{inspect.signature(fn)}; "
            f"expected {usage}"
        )
    return fn


def load_model_def(spec: str) -> ModelDef:
    """Import the module named by ``--model-def`` and check the contract."""
    module, name = import_module_of(spec)
    where = getattr(module, "__file__", module.__name__)
    model_fn = getattr(module, name, None)
    if model_fn is None:
        raise ModelDefError(f"{where} defines no `{name}` (named by --model-def {spec!r})")
    if not callable(model_fn):
        raise ModelDefError(f"--model-def {spec!r}: `{name}` is a {type(model_fn).__name__}, not a callable")
    loss = _require(module, where, "loss", "loss(labels, predictions)", 2)
    optimizer = _require(module, where, "optimizer", "optimizer(params, lr=...)", None)
    framework = _framework(module, optimizer)
    if framework is Framework.TENSORFLOW:
        usage, feed_usage = "optimizer(lr=...)", "feed(dataset, mode, metadata)"
        _require(module, where, "optimizer", f"{usage} (TensorFlow module)", 0)
    else:
        usage, feed_usage = "optimizer(params, lr=...)", "feed(records, mode, metadata)"
        _require(module, where, "optimizer", f"{usage} (PyTorch module)", 1)
    if "lr" not in inspect.signature(optimizer).parameters and not _positional_arity(optimizer)[2]:
        raise ModelDefError(f"{where}: `optimizer` must accept an `lr` keyword: {usage}")
    feed = _require(module, where, "feed", feed_usage, 3, "dataset_fn")
    eval_metrics_fn = getattr(module, "eval_metrics_fn", None)
    if eval_metrics_fn is not None:
        _require(module, where, "eval_metrics_fn", "eval_metrics_fn()", 0)
    callbacks = getattr(module, "callbacks", None)
    if callbacks is not None:
        _require(module, where, "callbacks", "callbacks()", 0)
    custom_data_reader = getattr(module, "custom_data_reader", None)
    if custom_data_reader is not None:
        _require(module, where, "custom_data_reader", "custom_data_reader(data_origin, records_per_task=None, "
                 "**kwargs) returning a reader with create_shards() and read_records(task)", 1)
    _check_columns(module, where)
    _check_record_batch(module, where, framework)
    return ModelDef(spec, module, model_fn, loss, optimizer, feed, eval_metrics_fn, callbacks, framework,
                    custom_data_reader)


def _check_record_batch(module: ModuleType, where: str, framework: Framework) -> None:
    flag = getattr(module, "record_batch", False)
    if not isinstance(flag, bool):
        raise ModelDefError(f"{where}: `record_batch` must be True or False (True: feed gets a "
                            f"flextrain.data.RecordBatch instead of a list of bytes), got {flag!r}")
    if flag and framework is Framework.TENSORFLOW:
        raise ModelDefError(f"{where}: `record_batch = True` is for PyTorch modules' feed(records, mode, metadata); "
                            "a TensorFlow module's feed gets a tf.data.Dataset")


def _check_columns(module: ModuleType, where: str) -> None:
    names = getattr(module, "columns", None)
    if names is None:
        return
    if isinstance(names, str) or not isinstance(names, list | tuple) or not names \
            or not all(isinstance(n, str) and n for n in names):
        raise ModelDefError(f"{where}: `columns` must be a non-empty list of column names (the table columns "
                            f"feed needs), got {names!r}")
