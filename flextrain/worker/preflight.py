"""Preflight: the module's contract, checked on real records before any worker starts.

``flextrain train`` (and the master pod of an ElasticJob, before it creates a
worker pod) runs ``python -m flextrain preflight --job-spec-json JSON`` as a
child process with a timeout, and refuses the job with the child's message
when a check fails. The child does what a worker does up to and through its
first training step, through the worker's own code, so a module that passes
here gets past the same points in a worker:

1. the module imports, and the training (and validation) data lists: ``make_shards``, or the
   shards of the module's ``custom_data_reader`` (flextrain.data.custom);
2. the module has every name with a usable signature: ``load_model_def``;
3. seeded like a worker, the model callable returns a ``torch.nn.Module`` (a
   Keras ``Model`` for TensorFlow modules) with trainable parameters:
   ``ModelDef.build_model``;
4. ``optimizer(...)`` with the job's learning rate returns a
   ``torch.optim.Optimizer`` (a Keras optimizer): ``ModelDef.build_optimizer``;
   ParameterServer jobs: one the parameter servers run;
5. the first ``min(global batch, max micro-batch)`` records of the first
   training file (``--max-micro-batch auto``: at most ``AUTO_RECORDS``, since
   what fits is not known before the workers probe it) go through
   ``feed(records, "training", metadata)`` and the worker's checks of what it returns;
6. forward and ``loss`` on them: the loss is a scalar that depends on the
   parameters (torch: requires grad; Keras: has a gradient); then backward
   and one optimizer step (AllReduce: through the worker's model backend);
7. with validation data, its first records go through ``feed(..., "evaluation", ...)``,
   the model and every ``eval_metrics_fn`` function (one value per sample).

Why a child: the module is user code. It may hang, exit, crash the interpreter,
print, or load a framework the CLI's process should not carry. The child moves
its stdout onto stderr before user code runs and writes JSON lines to a
private copy of the original stdout: ``{"stage": ...}`` as it goes (so a
timeout can say where it was stuck), then one ``{"ok": ...}`` result whose
``error`` names the module file, the function, the user's exception and the
user's file:line. Only JSON crosses the boundary; nothing is pickled or eval'd.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager

from flextrain.data import DataError
from flextrain.job import JobSpec, JobSpecError, Strategy
from flextrain.job.usermodule import module_attribute, module_columns
from flextrain.orphans import ENV_PARENT_PID
from flextrain.zygote import Zygote, ZygoteGone
from flextrain.worker.module import (FeedMetadata, Framework, Mode, ModelDef, ModelDefError, load_model_def,
                                     raised, returned)
from flextrain.worker.reading import job_shards, read_task_records

log = logging.getLogger("flextrain.preflight")

DEFAULT_TIMEOUT = 120.0
ENV_TIMEOUT = "FLEXTRAIN_PREFLIGHT_TIMEOUT"  # the default for `flextrain master` in a pod (no flag there)
MESSAGE_CHARS = 600  # of a user exception's text in the message
OUTPUT_TAIL_LINES = 15  # of the child's stderr, shown when it died or hung without a result
AUTO_RECORDS = 8  # records of the training step checked under --max-micro-batch auto


class PreflightError(ModelDefError):
    """The module failed preflight, or preflight did not finish; the message says which and why."""


def default_timeout() -> float:
    raw = os.environ.get(ENV_TIMEOUT)
    try:
        return float(raw) if raw and float(raw) > 0 else DEFAULT_TIMEOUT
    except ValueError:
        return DEFAULT_TIMEOUT


# ---- the parent: run the child, turn its answer into an exception ---------------------------------
def run_preflight(spec: JobSpec, *, timeout: float | None = None, skip_hint: str = "--no-preflight skips it",
                  zygote: Zygote | None = None) -> Framework:
    """Check ``spec``'s module in a child process; raises PreflightError (or DataError for the data).
    Returns the module's framework.

    ``skip_hint`` tells the user how to turn preflight off where it cannot work (a hang). With a
    ``zygote`` (flextrain/zygote.py) the child is forked from it, torch already imported. The child's
    output goes to files, not pipes: a grandchild the module left behind cannot hold the answer up."""
    timeout = default_timeout() if timeout is None else timeout
    env = {**os.environ, ENV_PARENT_PID: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
    args = ("preflight", "--job-spec-json", spec.to_json())
    module = spec.model_def
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        proc = _start(args, env, out_file, err_file, zygote)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
            stage = next((m["stage"] for m in reversed(_messages(_read(out_file))) if "stage" in m), "starting")
            raise PreflightError(f"preflight of {module} did not finish within {timeout:g}s (it was {stage}); "
                                 f"{skip_hint}{_tail(_read(err_file))}") from None
        finally:
            if proc.poll() is None:  # e.g. KeyboardInterrupt while waiting
                _kill(proc)
        out, err = _read(out_file), _read(err_file)
    log.debug("preflight of %s: exit code %s; its output:\n%s", module, proc.returncode, err)
    result = next((m for m in reversed(_messages(out)) if "ok" in m), None)
    if result is None:
        code = proc.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        raise PreflightError(f"preflight of {module} {how} without a result (the module may have exited or "
                             f"crashed the interpreter){_tail(err)}")
    if not result["ok"]:
        raise {"data": DataError, "spec": JobSpecError}.get(result.get("kind"), PreflightError)(result["error"])
    return Framework(result["framework"])


def _start(args: tuple[str, ...], env: dict[str, str], out, err, zygote: Zygote | None):
    """The child, in its own session (killed as a group: whatever the module started goes too)."""
    if zygote is not None and zygote.serves(env):
        try:
            with open(os.devnull, "rb") as null:
                return zygote.spawn(args, env={**env, ENV_PARENT_PID: str(zygote.pid)}, stdin=null.fileno(),
                                    stdout=out.fileno(), stderr=err.fileno())
        except ZygoteGone as exc:
            log.warning("%s: preflight starts as a fresh process", exc)
    return subprocess.Popen([sys.executable, "-m", "flextrain", *args], stdin=subprocess.DEVNULL, stdout=out,
                            stderr=err, env=env, start_new_session=True)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _read(file) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def _messages(out: str) -> list[dict]:
    found = []
    for line in (out or "").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def _tail(err: str) -> str:
    lines = [line for line in (err or "").splitlines() if line.strip()][-OUTPUT_TAIL_LINES:]
    return "; its last output:\n  " + "\n  ".join(lines) if lines else ""


# ---- the child: `flextrain preflight` --------------------------------------------------------------
def child_main(spec_json: str) -> int:
    """Run every check; write the JSON lines described above to the original stdout. Exit 0 or 1."""
    result = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # from here on anything printed (by Python or C) lands in the captured stderr

    def emit(**obj) -> None:
        result.write(json.dumps(obj) + "\n")
        result.flush()

    try:
        framework = check(JobSpec.from_json(spec_json), on_stage=lambda stage: emit(stage=stage))
    except (DataError, JobSpecError, ModelDefError) as exc:
        kind = "data" if isinstance(exc, DataError) else "spec" if isinstance(exc, JobSpecError) else "module"
        emit(ok=False, kind=kind, error=str(exc))
        return 1
    emit(ok=True, framework=framework.value)
    return 0


def check(spec: JobSpec, *, on_stage=lambda stage: None) -> Framework:
    """Every check of the module docstring, in this process; raises ModelDefError/DataError naming the
    problem. Returns the module's framework."""
    run = _Stages(spec.model_def, on_stage)
    with run.stage(f"importing the module of {spec.model_def}"):  # its custom_data_reader plans its own shards
        reader = module_attribute(spec.model_def, "custom_data_reader")
        # its `columns` against every Parquet file's footer (read to plan the shards anyway), not only
        # against the first shard read below: a later file without one would fail the job part way through
        columns = module_columns(spec.model_def)
    with run.stage("listing the data"):  # the CLI warns about skipped files
        shard = job_shards(spec, Mode.TRAINING, reader=reader, columns=columns)[0]
        validation = (job_shards(spec, Mode.EVALUATION, reader=reader, columns=columns)[0] if spec.data.validation
                      else None)
    with run.stage(f"importing the module of {spec.model_def}"):
        md = run.md = load_model_def(spec.model_def)
    if spec.training.auto_micro_batch or spec.worker.node_check:
        from flextrain.worker.probing import check_framework

        check_framework(spec, md)
    if spec.training.accelerate is not None:  # PyTorch modules only: a Keras one is refused, named
        from flextrain.worker.accelerating import check_framework as check_accelerate_framework

        check_accelerate_framework(spec, md)
    with run.stage("seeding the random generators"):
        _seed(md, spec.training.seed)
    with run.stage(f"building the model: {md.model_name}()", call=f"the model callable {md.model_name}()"):
        model = md.build_model()
    with run.stage("building the optimizer: optimizer(...)", call="optimizer(...)"):
        optimizer = md.build_optimizer(model, spec.training.learning_rate)
    if spec.strategy is Strategy.PARAMETER_SERVER:
        with run.stage("checking the optimizer for the parameter servers"):
            _check_ps_optimizer(md, spec)
    n = min(spec.training.global_batch_size, spec.training.effective_max_micro_batch, shard.size,
            AUTO_RECORDS if spec.training.auto_micro_batch else shard.size)
    with run.stage("reading the first training records"):
        records = read_task_records(md, shard.source, shard.start, shard.start + n, mode=Mode.TRAINING,
                                    data_origin=spec.data.training)
    meta = FeedMetadata(shard.source, shard.start, shard.start + n, 0)
    # AllReduce workers drive the model through a backend; PS workers through their own trainer.
    backend = None
    if spec.strategy is Strategy.ALLREDUCE:
        from flextrain.worker.frameworks import make_backend

        with run.stage("preparing the model for training"):
            backend = make_backend(model_def=md, model=model, optimizer=optimizer, extra=0)
        if spec.training.effective_lr_rule != "none":
            with run.stage(f"checking the optimizer for --lr-rule {spec.training.effective_lr_rule}"):
                backend.scale_lr(1.0)  # a learning rate the rule cannot scale is named here
    step = _keras_step if md.framework is Framework.TENSORFLOW else _torch_step
    step(run, md, model, optimizer, backend, records, meta)
    if validation is not None:
        _evaluate(run, md, model, validation, batch=n, data_origin=spec.data.validation)
    return md.framework


class _Stages:
    """Runs the checks one stage at a time; a user exception becomes a ModelDefError naming the
    module, what was being called, the exception and the user's file:line."""

    def __init__(self, model_def: str, on_stage) -> None:
        self.model_def, self.on_stage = model_def, on_stage
        self.md: ModelDef | None = None  # once the module is loaded

    @contextmanager
    def stage(self, what: str, *, call: str | None = None, records: FeedMetadata | None = None):
        """``records``: the records the stage's ``call`` is given (a data error it raises names them)."""
        self.on_stage(what)
        try:
            yield
        except DataError as exc:  # flextrain's readers name the file and the record already; a feed may not
            if records is None or records.source in str(exc):
                raise
            where = self.md.path if self.md is not None else self.model_def
            raise DataError(f"{where}: {call or what} raised {raised(exc)} on {records.source} records "
                            f"[{records.start}, {records.end}){_user_location(exc)}") from exc
        except ModelDefError as exc:  # a message already; with the user's line when it came from there
            at = _user_location(exc)
            if not at or at[5:-1].split(" in ")[0] in str(exc):  # none, or the message says it already
                raise
            raise ModelDefError(f"{exc}{at}") from exc
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code, whatever it raised
            where = self.md.path if self.md is not None else self.model_def
            text = raised(exc)
            if len(text) > MESSAGE_CHARS:  # TensorFlow's messages can quote whole graphs and records
                text = text[:MESSAGE_CHARS] + " ..."
            on = f" on {records.source} records [{records.start}, {records.end})" if records is not None else ""
            raise ModelDefError(f"{where}: {call or what} raised {text}{on}{_user_location(exc)}") from exc


def _user_location(exc: BaseException) -> str:
    """`` (at file.py:12 in feed)``: the innermost frame of the user's code that raised, if any."""
    from flextrain.worker.failure import user_frame  # the worker's own rule for "the user's frame"

    found = user_frame(exc)
    if found is not None:
        return f" (at {found[1].filename}:{found[1].lineno} in {found[1].name})"
    cause, seen = exc, set()
    while cause is not None and id(cause) not in seen:  # a syntax error has no frame: it says where it is
        if isinstance(cause, SyntaxError) and cause.filename:
            return f" (at {cause.filename}:{cause.lineno})"
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return ""


def _seed(md: ModelDef, seed: int) -> None:
    """As a worker seeds before it builds the model (worker/main.py)."""
    import torch

    torch.manual_seed(seed)
    if md.framework is Framework.TENSORFLOW:
        from flextrain.worker.tf.checks import seed_tf

        seed_tf(seed)


def _check_ps_optimizer(md: ModelDef, spec: JobSpec) -> None:
    from flextrain.worker.ps_trainer import check_ps_optimizer

    check_ps_optimizer(md, lr=spec.training.learning_rate)
    if md.framework is Framework.TENSORFLOW:
        from flextrain.worker.ps_keras import check_keras_ps_optimizer

        check_keras_ps_optimizer(md, lr=spec.training.learning_rate)


_LOSS = "loss(labels, predictions)"


def _torch_step(run: _Stages, md: ModelDef, model, optimizer, backend, records, meta) -> None:
    from flextrain.worker.pytorch import check_loss, feed_tensors

    with run.stage("feeding the first training records", call="feed(records, 'training', metadata)", records=meta):
        features, labels = feed_tensors(md, records, Mode.TRAINING, meta)
    if backend is not None:
        backend.zero()
    model.train()
    with run.stage("running the model on them", call=f"the model's forward ({type(model).__name__}.forward)"):
        predictions = model(features)
    with run.stage("computing the loss", call=_LOSS):
        loss = md.loss(labels, predictions)
    check_loss(md, loss, samples=len(records))  # the check every worker makes on every micro-batch
    with run.stage("backpropagating the loss", call="loss.backward()"):
        loss.backward()
    with run.stage("taking an optimizer step", call=f"the optimizer's step() ({type(optimizer).__name__})"):
        if backend is not None:
            backend.apply()
        else:
            optimizer.step()


def _keras_step(run: _Stages, md: ModelDef, model, optimizer, backend, records, meta) -> None:
    from flextrain.worker.tf.checks import require_tf
    from flextrain.worker.tf.feed import feed_dataset

    tf = require_tf()
    name = getattr(md.feed, "__name__", "feed")
    with run.stage("feeding the first training records", call=f"{name}(dataset, 'training', metadata)",
                   records=meta):
        features, labels = feed_dataset(md, records, Mode.TRAINING, meta)
    # Eagerly first, so an error names the model or the loss; then the worker's compiled step.
    with tf.GradientTape() as tape:
        with run.stage("running the model on them", call=f"the model ({type(model).__name__})"):
            predictions = model(features, training=True)
        with run.stage("computing the loss", call=_LOSS):
            loss = md.loss(labels, predictions)
    if not tf.is_tensor(loss) or loss.shape.rank != 0:
        shape = f"a tensor of shape {tuple(loss.shape)}" if tf.is_tensor(loss) else returned(loss)
        raise ModelDefError(f"{md.path}: {_LOSS} returned {shape} for {len(records)} samples; it must return "
                            "the mean over the samples, a scalar tensor (e.g. tf.reduce_mean(...))")
    with run.stage("computing gradients", call="tf.GradientTape.gradient of the loss"):
        grads = tape.gradient(loss, model.trainable_variables)
    if all(g is None for g in grads):
        raise ModelDefError(f"{md.path}: {_LOSS} returned a value with no gradient for any trainable weight "
                            "(a constant, or computed outside TensorFlow, e.g. with numpy?)")
    if backend is None:
        return
    with run.stage("running the worker's training step", call="the training step (model and loss under tf.function)"):
        backend.zero()
        backend.accumulate(features, labels, slice(0, len(records)), scale=1.0)
        backend.apply()


def check_evaluation(md: ModelDef, model, shard, *, batch: int, data_origin: str | None = None) -> None:
    """An evaluation-only job's check before its workers start (``check_inference_job``): the first records
    of ``shard`` through ``feed`` in 'evaluation' mode, the loaded ``model`` and the metrics, as training's
    preflight runs them: a failure names the module, the call and (a data error) the records."""
    run = _Stages(md.spec, lambda stage: None)
    run.md = md
    _evaluate(run, md, model, shard, batch=batch, data_origin=data_origin)


def check_prediction(md: ModelDef, model, shard, *, batch: int, data_origin: str | None = None) -> None:
    """A prediction job's check before its workers start: the first records of ``shard`` through ``feed``
    in 'prediction' mode and the loaded ``model``, into output rows that must be one per record and
    JSON-writable. The module's PredictionOutputsProcessor is not called (its side effects are the user's)."""
    import json

    from flextrain.worker.frameworks import make_predictor
    from flextrain.worker.prediction import predict_records

    run = _Stages(md.spec, lambda stage: None)
    run.md = md
    n = min(batch, shard.size)
    with run.stage("reading the first prediction records"):
        records = read_task_records(md, shard.source, shard.start, shard.start + n, mode=Mode.PREDICTION,
                                    data_origin=data_origin)
    meta = FeedMetadata(shard.source, shard.start, shard.start + n, 0)
    with run.stage("predicting the first records", call="prediction of the first records (feed in 'prediction' "
                   "mode, the model)", records=meta):
        rows, _ = predict_records(md, make_predictor(md, model), records, metadata=meta, batch_size=n)
    try:
        json.dumps(rows[:1])
    except (TypeError, ValueError) as exc:
        raise ModelDefError(f"{md.path}: the model's predictions cannot be written as JSON ({exc}); return "
                            "tensors or arrays of numbers, or a dict/tuple of them") from exc


def _evaluate(run: _Stages, md: ModelDef, model, shard, *, batch: int, data_origin: str | None = None) -> None:
    from flextrain.worker.evaluation import metric_sums
    from flextrain.worker.frameworks import make_predictor

    with run.stage("calling eval_metrics_fn()", call="eval_metrics_fn()"):
        md.metric_fns()
    n = min(batch, shard.size)
    with run.stage("reading the first validation records"):
        records = read_task_records(md, shard.source, shard.start, shard.start + n, mode=Mode.EVALUATION,
                                    data_origin=data_origin)
    meta = FeedMetadata(shard.source, shard.start, shard.start + n, 0)
    with run.stage("evaluating the first validation records",
                   call="evaluation of the first validation records (feed in 'evaluation' mode, the model, "
                        "eval_metrics_fn's functions)", records=meta):
        metric_sums(md, make_predictor(md, model), records, metadata=meta, batch_size=n)


__all__ = ["DEFAULT_TIMEOUT", "ENV_TIMEOUT", "PreflightError", "check", "check_evaluation", "check_prediction",
           "child_main", "default_timeout", "run_preflight"]
