"""The framework registry: which implementation serves a module's framework.

Framework-neutral code (:mod:`~flextrain.worker.module`, the trainers, evaluation,
preflight) asks here for what depends on the framework: the model check, the
optimizer built and checked, the model backend the round protocol drives, the
predictor evaluation and prediction run. The base modules
(:mod:`~flextrain.worker.backend`, :mod:`~flextrain.worker.evaluation`) never import
their implementations; this module does, lazily, so importing it costs nothing
and TensorFlow is imported only for a TensorFlow module.

Each framework registers a loader returning its :class:`FrameworkSupport`
(:func:`register`); PyTorch (:mod:`flextrain.worker.pytorch`) and Keras
(``flextrain/worker/tf/``) are registered below. A third framework adds one
module and one ``register`` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from flextrain.worker.contract import Framework, ModelDefError

if TYPE_CHECKING:
    from flextrain.worker.backend import ModelBackend
    from flextrain.worker.evaluation import Predictor
    from flextrain.worker.module import ModelDef


@dataclass(frozen=True)
class FrameworkSupport:
    """What one framework brings. ``check_model(model, where=...)`` returns the model callable's
    result if it is a trainable model of this framework (ModelDefError naming ``where`` else);
    ``build_optimizer(fn, model, kwargs, where=...)`` calls the module's ``optimizer`` and checks
    the result; ``backend(model_def=..., model=..., optimizer=..., extra=...)`` is a
    :class:`~flextrain.worker.backend.ModelBackend`; ``predictor(model_def, model)`` a
    :class:`~flextrain.worker.evaluation.Predictor`."""

    check_model: Callable[..., Any]
    build_optimizer: Callable[..., Any]
    backend: Callable[..., ModelBackend]
    predictor: Callable[..., Predictor]


_loaders: dict[Framework, Callable[[], FrameworkSupport]] = {}
_loaded: dict[Framework, FrameworkSupport] = {}


def register(framework: Framework, loader: Callable[[], FrameworkSupport]) -> None:
    """Make ``loader`` (called once, on first use) provide ``framework``'s implementation."""
    _loaders[framework] = loader
    _loaded.pop(framework, None)


def support(framework: Framework) -> FrameworkSupport:
    """The implementation of ``framework``; ModelDefError when none is registered."""
    if framework not in _loaded:
        if framework not in _loaders:
            raise ModelDefError(f"no implementation registered for {framework.value} modules")
        _loaded[framework] = _loaders[framework]()
    return _loaded[framework]


def make_backend(*, model_def: ModelDef, model, optimizer, extra: int, keep_lr: bool = False,
                 compute=None) -> ModelBackend:
    """The backend for the module's framework. ``keep_lr``: the job's ``--lr`` was given, so the
    optimizer's learning rate as built stays when a state is loaded (a resume may change it).
    ``compute``: the job's training strategy as applied (``--accelerate``, PyTorch only)."""
    backend = support(model_def.framework).backend(model_def=model_def, model=model, optimizer=optimizer,
                                                   extra=extra, **({} if compute is None else {"compute": compute}))
    backend.keep_lr = keep_lr
    return backend


def make_predictor(model_def: ModelDef, model, forward=None) -> Predictor:
    """The :class:`~flextrain.worker.evaluation.Predictor` for ``model``'s framework; ``forward``: how the
    model runs on features under the job's training strategy (``--accelerate``, PyTorch only)."""
    return support(model_def.framework).predictor(model_def, model, **({} if forward is None else {"forward": forward}))


def _pytorch() -> FrameworkSupport:
    from flextrain.worker import pytorch

    def predictor(model_def, model, forward=None):
        import torch

        if not isinstance(model, torch.nn.Module):
            raise ModelDefError(f"{model_def.spec}: no predictor for a model of type {type(model).__name__}")
        return pytorch.TorchPredictor(model_def, model, forward)

    return FrameworkSupport(check_model=pytorch.check_model, build_optimizer=pytorch.build_optimizer,
                            backend=pytorch.TorchBackend, predictor=predictor)


def _keras() -> FrameworkSupport:
    from flextrain.worker.tf.backend import KerasBackend
    from flextrain.worker.tf.checks import build_keras_optimizer, check_keras_model
    from flextrain.worker.tf.evaluation import KerasPredictor

    return FrameworkSupport(check_model=check_keras_model, build_optimizer=build_keras_optimizer,
                            backend=KerasBackend, predictor=KerasPredictor)


register(Framework.PYTORCH, _pytorch)
register(Framework.TENSORFLOW, _keras)

__all__ = ["FrameworkSupport", "make_backend", "make_predictor", "register", "support"]
