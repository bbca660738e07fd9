"""``--accelerate`` in a worker: the job's training strategy, found and applied to the module's model.

Contract of :func:`accelerate_worker`, called by an AllReduce worker of a PyTorch module after it built
its model and before it builds the optimizer (which takes the parameters as the strategy left them)
and registers:

* The strategy. A given one (the JobSpec's comma list, or JSON) is parsed and checked as at
  submission (:mod:`flextrain.accelerate.jobs`). With ``auto`` the worker asks the master
  (``Accelerate`` RPC, flextrain/master/accelerating.py): USE: apply the job's strategy, not
  searching; SEARCH: search (:func:`search_strategy`) on its own records, send the choice, apply the
  one the master kept; WAIT: another worker searches, ask again every :data:`WAIT_POLL` seconds.
* Applying it: :func:`flextrain.accelerate.apply_strategy` on the model, on the model's device, in a
  world of one process (a job's data parallelism is flextrain's own all-reduce: ``parallel_mode`` and
  ``auto_ddp`` are left out), with the module's loss and no optimizer or loader. What the worker gets
  (:class:`JobAcceleration`):

  - ``core``: the module as the strategy left it (half's casts, patched forwards, replaced
    modules), never a wrapper: what the optimizer steps, checkpoints hold, rank 0 broadcasts and
    a resume loads, so ``state_dict`` keys are the plain model's (a compiled model's ``_orig_mod.``
    prefix never reaches a checkpoint);
  - ``forward(features)``: the strategy's input casts (half, channels_last), then the model as the
    strategy made it (compiled, under autocast): what the trainer's micro-batches run;
  - ``loss(labels, predictions)``: the module's loss, under the strategy's loss wrappers (amp's
    autocast);
  - ``evaluate(features)``: the input casts, then ``core`` (not compiled): what evaluation runs.

  The trainer's micro-batches, gradient buffers (any float dtype: half's bf16 gradients are
  reduced in bf16), all-reduce, task ledger and checkpoints are unchanged, so exactly-once and the
  fixed global batch hold under any strategy.
* The worker's log says what it applied and how it was chosen: ``accelerate: applying
  amp_native:bf16 (given by --accelerate)``; with auto ``accelerate: searched ...`` on the worker that
  searched and ``(searched by worker-0; not searching again)`` on every other.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from flextrain.accelerate import AccelerateError, Inputs, Strategy, UnavailableMethodError, apply_strategy
from flextrain.accelerate.jobs import applied_in_jobs, check_for_jobs, describe, job_candidate, parse_setting
from flextrain.elastic.world import World, WorldSource
from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.contract import Framework, ModelDefError
from flextrain.worker.module import ModelDef
from flextrain.worker.pytorch import check_loss, take

log = logging.getLogger("flextrain.worker")

WAIT_POLL = 0.5  # seconds between asks while another worker searches
ONE_PROCESS = World(processes=1, rank=0, devices_per_process=1, source=WorldSource.LOCAL_DEVICES)


class AccelerateSettingError(ModelDefError):
    """The job's strategy cannot apply to this module here (the message names the method and why); a
    relaunch would meet the same, so the job fails with it."""


@dataclass(frozen=True)
class JobAcceleration:
    """A strategy applied to a worker's model (module docstring)."""

    strategy: Strategy  # as applied (configs as the methods took them)
    source: str  # how it was chosen: "given by --accelerate", "searched by worker-0", ...
    core: torch.nn.Module
    forward: Callable[[Any], Any]
    loss: Callable[[Any, Any], Any]
    evaluate: Callable[[Any], Any]
    notes: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        return describe(self.strategy)


def check_framework(spec: JobSpec, model_def: ModelDef) -> None:
    """``--accelerate`` applies PyTorch strategies: ModelDefError naming a Keras module."""
    if spec.training.accelerate is not None and model_def.framework is not Framework.PYTORCH:
        raise AccelerateSettingError(f"--accelerate applies training strategies to PyTorch models; {model_def.path} "
                                     f"is a {model_def.framework.value} module: leave --accelerate out")


def accelerate_worker(spec: JobSpec, model_def: ModelDef, model: torch.nn.Module, client) -> JobAcceleration:
    """The job's strategy for this worker, applied to ``model`` (module docstring)."""
    check_framework(spec, model_def)
    if spec.training.auto_accelerate:
        strategy, source = _agreed(spec, model_def, model, client)
    else:
        strategy, source = _parsed(spec.training.accelerate, "--accelerate"), "given by --accelerate"
    applied = apply_for_job(strategy, model, model_def, source=source)
    log.info("accelerate: applying %s (%s)%s", applied.description, source,
             "".join(f"; {n}" for n in applied.notes))
    return applied


def _parsed(text: str, what: str) -> Strategy:
    try:
        strategy = parse_setting(text, what=what)
        assert strategy is not None  # auto is handled by the caller
        return check_for_jobs(strategy, what=what)
    except AccelerateError as exc:
        raise AccelerateSettingError(str(exc)) from None


def _agreed(spec: JobSpec, model_def: ModelDef, model: torch.nn.Module, client) -> tuple[Strategy, str]:
    """``--accelerate auto``: the job's strategy from the master, searched here when the master says so."""
    waiting_for = None
    while True:
        resp = client.accelerate()
        if resp.action == pb.AccelerateResponse.USE:  # chosen before this worker asked
            return _parsed(resp.strategy_json, "the job's strategy (--accelerate auto)"), \
                f"{resp.source}; not searching again"
        if resp.action == pb.AccelerateResponse.SEARCH:
            try:
                chosen, summary = search_strategy(spec, model_def, model)
            except AccelerateError as exc:  # the module's own step cannot run as a dry run does it
                raise AccelerateSettingError(f"--accelerate auto: the search's dry run of the module's training "
                                             f"step failed: {exc}") from None
            resp = client.accelerate(strategy_json=chosen.to_json(indent=None), search_json=json.dumps(summary))
            if resp.action != pb.AccelerateResponse.USE:  # the master keeps the first choice it is sent
                raise RuntimeError(f"the master did not take the strategy this worker's search chose ({resp})")
            return _parsed(resp.strategy_json, "the job's strategy (--accelerate auto)"), resp.source
        if resp.source != waiting_for:
            log.info("accelerate: waiting for the job's strategy (%s)", resp.source)
            waiting_for = resp.source
        time.sleep(WAIT_POLL)


def apply_for_job(strategy: Strategy, model: torch.nn.Module, model_def: ModelDef, *,
                  source: str = "") -> JobAcceleration:
    """``strategy`` applied to ``model`` as a job trains it (module docstring)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    inputs = Inputs.checked(model, loss_func=_module_loss(model_def))
    try:
        applied = apply_strategy(applied_in_jobs(strategy), inputs, device=device, world=ONE_PROCESS,
                                 dataloader=False)
    except UnavailableMethodError as exc:  # e.g. tf32 on a CPU, checkpoint of a class the model lacks
        raise AccelerateSettingError(f"--accelerate asks for {exc.name!r}, which cannot apply to the model of "
                                     f"{model_def.spec} on {device}: {exc.reason}") from None
    except AccelerateError as exc:
        raise AccelerateSettingError(f"--accelerate: {exc}") from None
    result = applied.result
    prepare, model_now, core = result.prepare_input, result.model, applied.core

    def forward(features: Any) -> Any:
        return model_now(prepare(features))

    def evaluate(features: Any) -> Any:
        return core(prepare(features))

    return JobAcceleration(strategy=applied.report.strategy, source=source, core=core, forward=forward,
                           loss=result.loss_func, evaluate=evaluate, notes=applied.report.notes)


def _module_loss(model_def: ModelDef) -> Callable[[Any, Any], Any]:
    """The module's ``loss(labels, predictions)``, checked as the module contract says (so its errors name
    the module, before the strategy's wrappers look at the result)."""

    def loss(labels: Any, predictions: Any) -> Any:
        leaves = [t for t in torch.utils._pytree.tree_leaves(labels) if isinstance(t, torch.Tensor) and t.dim()]
        return check_loss(model_def, model_def.loss(labels, predictions), samples=leaves[0].shape[0] if leaves else 1)

    return loss


# ---- the search -----------------------------------------------------------------------------------------------
# auto_accelerate's fully automatic search (flextrain.accelerate.search), run on the job's first records with
# the module's model, optimizer and loss, less what a job refuses (data parallelism is flextrain's own).

SEARCH_TIME_LIMIT = 60.0  # seconds (the search's own rule: no candidate starts that would not fit)
SEARCH_MICRO_BATCH = 64  # most samples per dry-run step (else the job's micro-batch)
# Never candidates in a job (flextrain.accelerate.jobs says why); tests may add native_dynamo (a slow build).
SEARCH_EXCLUDED = ("zero1", "zero2", "fsdp", "fsdp2", "parallel_mode", "auto_ddp")


class _JobStep(torch.nn.Module):
    """The model as a dry run calls it: a batch is ``(features, labels)`` and the model takes the features."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> Any:
        return self.model(batch[0])


def search_strategy(spec: JobSpec, model_def: ModelDef, model: torch.nn.Module, *,
                    time_limit: float = SEARCH_TIME_LIMIT) -> tuple[Strategy, dict]:
    """The strategy for this job and what the search measured: :func:`flextrain.accelerate.search.search`
    on a micro-batch of the job's first training records, from the module's model (never touched: dry runs
    train copies), optimizer and loss; the fastest accepted candidate a job may apply wins (none: no
    methods). A candidate whose loss leaves the plain run's beyond its methods' tolerance is rejected."""
    from flextrain.accelerate.search import search
    from flextrain.worker.probing import first_records  # the probe's reading of the first records

    started = time.monotonic()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    m = min(SEARCH_MICRO_BATCH, spec.training.global_batch_size,
            spec.training.max_micro_batch if isinstance(spec.training.max_micro_batch, int) else SEARCH_MICRO_BATCH)
    features, labels, n = first_records(spec, model_def, m)
    m = min(m, n)
    lr = spec.training.learning_rate
    inputs = Inputs.checked(_JobStep(model), loss_func=lambda batch, out: _module_loss(model_def)(batch[1], out),
                            optim_func=lambda params: model_def.optimizer(params, **({} if lr is None else {"lr": lr})),
                            sample_batch=(take(features, slice(0, m)), take(labels, slice(0, m))))
    found = search(inputs, device=device, world=ONE_PROCESS, excluded=SEARCH_EXCLUDED, time_limit=time_limit)
    allowed = [c for c in found.candidates if c.accepted and job_candidate(c.strategy)]
    best = max(allowed, key=lambda c: (c.samples_per_second or 0.0, -len(c.strategy)), default=None)
    chosen = best.strategy if best is not None else Strategy()
    rows = [_row(c, found.speedup(c)) for c in found.candidates]
    summary = {"chosen": describe(chosen), "candidates": rows, "microBatch": m, "records": n,
               "plainSamplesPerSecond": round(found.plain.samples_per_second or 0.0, 1),
               "stoppedEarly": found.stopped_early, "seconds": round(time.monotonic() - started, 2)}
    log.info("accelerate: searched %d candidate strategies in %.1f s on %d records (micro-batch %d): chose %s%s",
             len(rows), summary["seconds"], n, m, describe(chosen),
             "".join(f"; {row['strategy']}: " + (f"{row['speedup']:.2f}x" if row.get("ok") else row.get("reason", ""))
                     for row in rows))
    return chosen, summary


def _row(c: Any, speedup: float | None) -> dict:
    row: dict = {"strategy": describe(c.strategy), "ok": bool(c.accepted)}
    if c.accepted and speedup is not None:
        row.update(speedup=round(speedup, 3), samplesPerSecond=round(c.samples_per_second, 1))
    else:
        row.update(ok=False, reason=c.reason or c.status)
    return row


__all__ = ["AccelerateSettingError", "JobAcceleration", "accelerate_worker", "apply_for_job", "check_framework",
           "search_strategy"]
