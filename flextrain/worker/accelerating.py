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

from flextrain.accelerate import (
    AccelerateError, Inputs, Strategy, UnavailableMethodError, apply_strategy, compare, dry_run, get, names,
)
from flextrain.accelerate.dryrun import plain_strategy, warmup_of
from flextrain.accelerate.strategy import conflict
from flextrain.accelerate.jobs import (
    NO_OPS, applied_in_jobs, check_for_jobs, describe, job_candidate, parse_setting,
)
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


# ---- the search: REPLACEABLE --------------------------------------------------------------------------------
# Until flextrain.accelerate's fully automatic mode (auto_accelerate(..., load_strategy=None), written apart)
# is on this branch, --accelerate auto searches here, and only here: replace search_strategy's body by a call
# of that function on the same inputs (the model wrapped by _JobStep, the module's optimizer and loss, the
# batches below) with excluded=the methods a job refuses, keeping its (strategy, summary) result.

SEARCH_MARGIN = 1.05  # a candidate replaces the plain run only when this much faster
SEARCH_TIME_LIMIT = 60.0  # seconds; no candidate starts after it (a running one finishes)
SEARCH_MICRO_BATCH = 64  # most samples per dry-run step (else the job's micro-batch)
SEARCH_STEPS = 5  # timed steps per dry run
# Configs a job searches beyond a method's own candidates (amp_native's default, fp16, is refused in jobs).
JOB_CONFIGS = {"amp_native": ("bf16",)}


class _JobStep(torch.nn.Module):
    """The model as a dry run calls it: a batch is ``(features, labels)`` and the model takes the features."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> Any:
        return self.model(batch[0])


def _candidates(model: torch.nn.Module, device: torch.device) -> list[Strategy]:
    """One strategy per method and config a job may apply alone on this model (the method's own
    candidates and their neighbours: amp_native's fp16 default leads to its bf16), compile last."""
    out: list[Strategy] = []
    for name in sorted(names(), key=lambda n: (n == "native_dynamo", n)):
        if name in NO_OPS:
            continue
        method = get(name)
        configs = list(method.candidates(model, device, ONE_PROCESS))
        configs += [n for c in configs for n in method.neighbours(c) if n not in configs]
        configs += [c for c in map(method.validate, JOB_CONFIGS.get(name, ())) if c not in configs]
        for config in configs:
            candidate = Strategy([(name, config)])
            if job_candidate(candidate) and method.check(model, device, ONE_PROCESS, config) is None:
                out.append(candidate)
    return out


def search_strategy(spec: JobSpec, model_def: ModelDef, model: torch.nn.Module, *,
                    time_limit: float = SEARCH_TIME_LIMIT) -> tuple[Strategy, dict]:
    """REPLACEABLE (see above): the strategy for this job and what the search measured. Each candidate
    (:func:`_candidates`) is dry-run against the plain run on the same batches of the job's first
    training records, from the same weights (flextrain.accelerate.dryrun.compare: a loss off the plain
    run's beyond the methods' tolerance rejects it); the fastest that beats the plain run by
    :data:`SEARCH_MARGIN` wins, then the best together when two or more do; none: no methods. ``model``
    is never touched (dry runs train copies)."""
    from flextrain.worker.probing import first_records  # the probe's reading of the first records

    started = time.monotonic()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    m = min(SEARCH_MICRO_BATCH, spec.training.global_batch_size,
            spec.training.max_micro_batch if isinstance(spec.training.max_micro_batch, int) else SEARCH_MICRO_BATCH)
    features, labels, n = first_records(spec, model_def, 4 * m)
    m = min(m, n)
    batches = [(take(features, slice(i, i + m)), take(labels, slice(i, i + m))) for i in range(0, n - m + 1, m)]
    lr = spec.training.learning_rate
    inputs = Inputs.checked(_JobStep(model), loss_func=lambda batch, out: _module_loss(model_def)(batch[1], out),
                            optim_func=lambda params: model_def.optimizer(params, **({} if lr is None else {"lr": lr})),
                            sample_batch=batches[0])
    candidates = _candidates(model, device)
    # One plain run per warmup length (a compiled candidate warms up longer): same batches, weights, seed.
    # The first dry run of a process also warms the process up: the plain run goes first, and again at the end.
    baselines: dict[int, Any] = {}

    def plain(warmup: int) -> Any:
        return dry_run(plain_strategy(ONE_PROCESS), inputs, steps=SEARCH_STEPS, warmup=warmup, batches=batches,
                       device=device, world=ONE_PROCESS)

    def measure(candidate: Strategy) -> Any:
        warmup = warmup_of(candidate)
        if warmup not in baselines:
            baselines[warmup] = plain(warmup)
        return compare(candidate, inputs, baseline=baselines[warmup], steps=SEARCH_STEPS, warmup=warmup,
                       batches=batches, device=device, world=ONE_PROCESS)

    plain(1)  # warms the process up; not counted
    runs: list[tuple[Strategy, Any]] = []
    tried: list[dict] = []
    for candidate in candidates:
        if time.monotonic() - started > time_limit:
            tried.append({"strategy": describe(candidate), "ok": False, "reason": "not tried: the time limit ran out"})
            continue
        runs.append((candidate, measure(candidate)))
    # The plain run's speed: the faster of its runs before the candidates and one after them (noise on a
    # busy machine counts against the candidates, not for them).
    after = plain(1)
    plain_sps = max([b.samples_per_second for b in (*baselines.values(), after) if b.ok] or [0.0])

    def speedup(c: Any) -> float:
        return c.candidate.samples_per_second / plain_sps if c.accepted and plain_sps else 0.0

    winners = sorted(((speedup(c), s) for s, c in runs if speedup(c) >= SEARCH_MARGIN), key=lambda w: -w[0])
    chosen = winners[0][1] if winners else Strategy()
    if len(winners) >= 2 and time.monotonic() - started <= time_limit:
        together = Strategy()
        for _, w in winners:  # the fastest first; one of a group (amp_native or half)
            if conflict([*together.names, *w.names]) is None and job_candidate(together + w):
                together = together + w
        if len(together) > 1:
            c = measure(together)
            runs.append((together, c))
            if speedup(c) > winners[0][0]:
                chosen = together
    tried = [_row(s, c, speedup(c)) for s, c in runs] + tried
    summary = {"chosen": describe(chosen), "candidates": tried, "microBatch": m, "records": n,
               "plainSamplesPerSecond": round(plain_sps, 1), "margin": SEARCH_MARGIN,
               "seconds": round(time.monotonic() - started, 2)}
    log.info("accelerate: searched %d candidate strategies in %.1f s on %d records (micro-batch %d): chose %s%s",
             len(tried), summary["seconds"], n, m, describe(chosen),
             "".join(f"; {row['strategy']}: " + (f"{row['speedup']:.2f}x" if row.get("ok") else row.get("reason", ""))
                     for row in tried))
    return chosen, summary


def _row(candidate: Strategy, c: Any, speedup: float) -> dict:
    row: dict = {"strategy": describe(candidate), "ok": bool(c.accepted)}
    if c.accepted:
        row.update(speedup=round(speedup, 3), samplesPerSecond=round(c.candidate.samples_per_second, 1))
    else:
        row["reason"] = c.candidate.reason or c.baseline.reason
    return row


__all__ = ["AccelerateSettingError", "JobAcceleration", "accelerate_worker", "apply_for_job", "check_framework",
           "search_strategy"]
