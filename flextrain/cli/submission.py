"""What ``flextrain train`` does of a local job's module before its processes start: checks that need the
module imported (without preflight only: preflight checks it all in a child, so this process imports
neither the module nor its framework), and the zygote's preload of the module's framework."""

from __future__ import annotations


def import_meanwhile(name: str) -> None:
    """Import ``name`` in a thread while this one waits on children (an error shows where it is used)."""
    import importlib
    import threading

    def load() -> None:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the main thread's own import raises it, in context
            pass

    threading.Thread(target=load, name=f"import-{name}", daemon=True).start()


def check_module(spec):
    """Without preflight: what this process can check of the module by importing it (preflight checks all
    of it in a child, so that this process need not import the module, nor its framework). Returns its
    framework."""
    from flextrain.job import Strategy
    from flextrain.worker.accelerating import check_framework as check_accelerate_framework
    from flextrain.worker.module import Framework, load_model_def
    from flextrain.worker.probing import check_framework
    from flextrain.worker.ps_trainer import check_ps_optimizer

    model_def = load_model_def(spec.model_def)
    if spec.training.auto_micro_batch or spec.worker.node_check:
        check_framework(spec, model_def)
    check_accelerate_framework(spec, model_def)  # PyTorch modules only: a Keras one is refused, named
    if spec.strategy is Strategy.PARAMETER_SERVER:
        check_ps_optimizer(model_def, lr=spec.training.learning_rate)
        if model_def.framework is Framework.TENSORFLOW:
            from flextrain.worker.ps_keras import check_keras_ps_optimizer

            check_keras_ps_optimizer(model_def, lr=spec.training.learning_rate)
    return model_def.framework


def preload_by_source(zygote, spec) -> None:
    """A module whose source imports TensorFlow at its top level loads it in every process that imports
    the module: the zygote imports it at once, and preflight, forked after it, starts with it loaded."""
    from flextrain.job.usermodule import TF_PACKAGES, top_level_imports
    from flextrain.worker.module import Framework

    if zygote is not None and spec.model_def and top_level_imports(spec.model_def) & set(TF_PACKAGES):
        preload_framework(zygote, Framework.TENSORFLOW)


def preload_framework(zygote, framework) -> None:
    """A Keras job's children each import TensorFlow (~6-8 s of CPU here): once preflight (or, without it,
    this process's import) has named the framework, the zygote imports it once and forks them with it loaded
    (a no-op where :func:`preload_by_source` asked already)."""
    from flextrain.worker.module import Framework

    if zygote is not None and framework is Framework.TENSORFLOW:
        zygote.preload(framework.value)


__all__ = ["check_module", "import_meanwhile", "preload_by_source", "preload_framework"]
