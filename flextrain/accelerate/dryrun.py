"""Dry runs: a few training steps of a strategy on a copy of the model, measured and checked.

:func:`dry_run` applies a strategy to a deep copy of the model (the user's model is never
touched), runs ``warmup`` + ``steps`` training steps (``prepare_input`` -> model -> ``loss_func``
-> ``backward`` -> ``step`` -> ``zero_grad``, the loop ``auto_accelerate``'s result is made for),
and reports the samples per second of the timed steps (every process's samples over the slowest
process's time, a process's time being its median step's times the steps: one step stalled by
another program on a shared machine does not count), the peak memory (CUDA: the allocator's peak over the timed steps; CPU: one more
step measured by :func:`flextrain.elastic.memory.step_peak`) and the loss of every step. With a
``reference`` (another run's losses on the same batches from the same weights) it rejects a run
whose loss drifts further than the strategy's tolerance (the largest ``loss_tolerance`` of its
methods, or ``rtol``), comparing the steps up to the first update an amp scaler skipped (fp16's
loss scale calibrates by skipping steps, after which the weights differ on purpose); a run that
raises or reaches a non-finite loss is rejected too. Errors in the user's arguments (a non-scalar loss, a batch of the wrong structure) are raised, not reported.

:func:`compare` runs the plain strategy (:func:`plain_strategy`: nothing, or DDP alone when
several processes train) and a candidate on the same batches (:func:`sample_batches`) from the
same weights and seed. The automatic search (:mod:`flextrain.accelerate.search`) runs the
plain strategy first and passes it as ``reference=`` to every candidate's dry run, with a
``deadline`` (its time limit) at which a run stops between steps.

On the CPU a compiled model's fused kernels allocate outside torch's dispatcher, so its peak
is under-counted: compare compiled strategies there by samples per second.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from flextrain.accelerate.apply import apply_strategy, current_world, default_device
from flextrain.accelerate.context import Inputs, Skipped
from flextrain.accelerate.data import build_dataloader, call_model, loss_of
from flextrain.accelerate.errors import AccelerateError
from flextrain.accelerate.methods import get
from flextrain.accelerate.strategy import Strategy
from flextrain.elastic.memory import format_bytes, step_peak
from flextrain.elastic.world import World
from flextrain.elastic.wrapping import WrappedOptimizer


@dataclass(frozen=True)
class DryRunResult:
    """What a dry run measured. ``ok`` False: ``reason`` says why (an error, a non-finite loss, a loss
    off the reference's)."""

    strategy: Strategy
    ok: bool
    samples_per_second: float | None = None
    peak_bytes: int | None = None
    losses: tuple[float, ...] = ()
    step_seconds: tuple[float, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    reason: str | None = None
    rtol: float | None = None
    skipped_steps: int = 0  # optimizer steps an amp scaler skipped (non-finite gradients)
    wall_seconds: float | None = None  # the whole dry run (apply, compile, every step), slowest process
    timed_out: bool = False  # stopped between steps at ``deadline`` (the search's time limit)

    def describe(self) -> str:
        names = ", ".join(self.strategy.names) or "plain"
        if not self.ok:
            return f"[{names}] rejected: {self.reason}"
        peak = format_bytes(self.peak_bytes) if self.peak_bytes is not None else "?"
        return f"[{names}] {self.samples_per_second:.1f} samples/s, peak {peak}, last loss {self.losses[-1]:.4g}"


@dataclass(frozen=True)
class Comparison:
    """A candidate's dry run against the plain run's, on the same batches from the same weights."""

    candidate: DryRunResult
    baseline: DryRunResult

    @property
    def accepted(self) -> bool:
        return self.candidate.ok and self.baseline.ok

    @property
    def speedup(self) -> float | None:
        """Candidate samples/s over the baseline's (None unless both ran)."""
        if not self.accepted:
            return None
        return self.candidate.samples_per_second / self.baseline.samples_per_second

    @property
    def memory_ratio(self) -> float | None:
        """Candidate peak memory over the baseline's (None unless both ran)."""
        if not self.accepted or not self.baseline.peak_bytes:
            return None
        return self.candidate.peak_bytes / self.baseline.peak_bytes


def plain_strategy(world: World) -> Strategy:
    """The reference a strategy is compared with: no method, or DDP alone when several processes train."""
    return Strategy(["parallel_mode"] if world.processes > 1 else [])


def strategy_rtol(strategy: Strategy) -> float:
    """The loss drift a strategy may have from the plain run: the largest of its methods' tolerances."""
    return max((get(s.name).loss_tolerance(s.config) for s in strategy), default=1e-3)


def sample_batches(inputs: Inputs, count: int, *, world: World | None = None) -> list[Any]:
    """``count`` raw batches (before ``prepare_input``) of this process's share of the data, the
    same for every dry run: from a loader over ``inputs.dataset`` (cycled when it has fewer), else
    ``inputs.sample_batch`` repeated."""
    if inputs.dataset is not None:
        loader, _ = build_dataloader(inputs.dataset, inputs.dataloader_args, world or current_world(),
                                     distributed_sampler_cls=inputs.distributed_sampler_cls, seed=inputs.sampler_seed)
        first = list(itertools.islice(loader, count))
        if not first:
            raise AccelerateError("dataset gave no batch for a dry run")
        return list(itertools.islice(itertools.cycle(first), count))
    if inputs.sample_batch is not None:
        return [inputs.sample_batch] * count
    raise AccelerateError("a dry run needs data: give dataset (with dataloader_args) or sample_batch")


def missing_for_dry_run(inputs: Inputs) -> list[str]:
    """The arguments a dry run needs that ``inputs`` lacks (ATorch skips its dry run then)."""
    missing = [n for n in ("optim_func", "loss_func") if getattr(inputs, n) is None]
    if inputs.dataset is None and inputs.sample_batch is None:
        missing.append("dataset (or sample_batch)")
    return missing


def _samples(batch: Any) -> int:
    leaves = [t for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor) and t.dim() > 0]
    return int(leaves[0].shape[0]) if leaves else 1


def _held_bytes(model: torch.nn.Module, optimizer: Any) -> int:
    """Bytes the model and optimizer hold between steps (sharded tensors: the local shard)."""
    inner = optimizer.optimizer if isinstance(optimizer, WrappedOptimizer) else optimizer
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if inner is not None:
        tensors += [t for s in inner.state.values() for t in torch.utils._pytree.tree_leaves(s)
                    if isinstance(t, torch.Tensor)]
    seen: dict[int, Any] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        try:
            st = local.untyped_storage()
        except (RuntimeError, NotImplementedError):
            continue
        seen.setdefault(id(st), st)
    return sum(st.nbytes() for st in seen.values())


def _agree(values: list[float], op: Any, device: torch.device) -> list[float]:
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=op)
    return t.tolist()


def _off_reference(losses: Sequence[float], reference: Sequence[float], rtol: float) -> str | None:
    for i, (got, ref) in enumerate(zip(losses, reference)):
        if abs(got - ref) > rtol * max(abs(ref), 1e-8) + 1e-7:
            return (f"loss at step {i + 1} is {got:.6g}, the plain run's {ref:.6g}: off by "
                    f"{abs(got - ref) / max(abs(ref), 1e-8):.2%} (tolerance {rtol:.2%})")
    return None


def warmup_of(strategy: Strategy) -> int:
    """Untimed steps before a dry run's timed ones: the most any method of the strategy needs."""
    return max((get(s.name).warmup_steps for s in strategy), default=1)


def dry_run(strategy: Any, inputs: Inputs, *, steps: int = 3, warmup: int | None = None,
            batches: Sequence[Any] | None = None,
            device: Any = None, world: World | None = None, skip_unavailable: bool = True, reference: Any = None,
            rtol: float | None = None, seed: int = 0, deadline: float | None = None) -> DryRunResult:
    """Run ``strategy`` for ``warmup + steps`` steps on a copy of ``inputs.model`` (module docstring).
    ``warmup`` None: :func:`warmup_of` the strategy. ``batches``: raw batches to use (default
    :func:`sample_batches`; cycled when fewer); ``reference``: a DryRunResult or a list of per-step
    losses to hold this run's losses to. ``deadline`` (a :func:`time.perf_counter` value): the run
    stops between steps once it has passed (every process agrees when), rejected with
    ``timed_out`` set; a step under way (e.g. one that compiles) finishes first."""
    started = time.perf_counter()
    strategy = Strategy.load(strategy)
    warmup = warmup_of(strategy) if warmup is None else warmup
    for name, value in (("steps", steps), ("warmup", warmup)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "steps" else 0):
            raise AccelerateError(f"{name} must be an integer >= {1 if name == 'steps' else 0}, got {value!r}")
    device, world = default_device(device), world or current_world()
    missing = [m for m in missing_for_dry_run(inputs) if not (batches is not None and m.startswith("dataset"))]
    if missing:
        raise AccelerateError(f"a dry run needs {', '.join(missing)}")
    total = warmup + steps + (1 if device.type == "cpu" else 0)
    batches = list(batches) if batches is not None else sample_batches(inputs, total, world=world)
    batches = list(itertools.islice(itertools.cycle(batches), total))
    tol = strategy_rtol(strategy) if rtol is None else rtol
    ref_losses = reference.losses if isinstance(reference, DryRunResult) else reference
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        try:
            applied = apply_strategy(strategy, inputs, device=device, world=world, skip_unavailable=skip_unavailable,
                                     copy_model=True, dataloader=False)
        except AccelerateError:
            raise
        except Exception as e:  # e.g. a wrapper that refuses this model: a rejected candidate
            wall, = _agree([time.perf_counter() - started], dist.ReduceOp.MAX, device)
            return DryRunResult(strategy, False, reason=f"applying it failed: {type(e).__name__}: {e}", rtol=tol,
                                wall_seconds=wall)
        try:
            result = _run(applied, inputs, batches, warmup, steps, device, deadline)
        finally:
            applied.restore()
    sps, peak, losses, seconds, skips, error = result
    timed_out = error == _TIMED_OUT
    reason = error
    if reason is None and not all(math.isfinite(v) for v in losses):
        reason = f"a loss is not finite: {losses}"
    if reason is None and ref_losses is not None:
        # After a skipped update (fp16's scaler calibrating) the runs' weights differ on purpose:
        # the losses up to and including that step's are comparable.
        compared = len(losses) if not skips else skips[0] + 1
        reason = _off_reference(losses[:compared], ref_losses, tol)
    ok = _agree([0.0 if reason else 1.0], dist.ReduceOp.MIN, device)[0] == 1.0
    if not ok and reason is None:
        reason = "rejected on another process"
    if timed_out:
        reason = f"stopped at the time limit after {len(losses)} step(s)"
    wall, = _agree([time.perf_counter() - started], dist.ReduceOp.MAX, device)
    return DryRunResult(applied.report.strategy, ok, sps if ok else None, peak if ok else None, tuple(losses),
                        tuple(seconds), applied.report.skipped, reason, tol, len(skips), wall, timed_out)


_TIMED_OUT = "timed out"  # _run's error when it stopped at the deadline


def _run(applied: Any, inputs: Inputs, batches: list[Any], warmup: int, steps: int, device: torch.device,
         deadline: float | None = None) -> tuple[float | None, int | None, list[float], list[float], list[int],
                                                 str | None]:
    model, optim, loss_func, prepare = (applied.result.model, applied.result.optim, applied.result.loss_func,
                                        applied.result.prepare_input)
    fmt = inputs.model_input_format
    losses: list[float] = []
    stage = ["prepare_input(batch, device)"]  # what was running when an exception came
    skips: list[int] = []  # the steps whose update the optimizer skipped

    def step(batch: Any) -> None:
        stage[0] = "prepare_input(batch, device)"
        data = prepare(batch, device)
        stage[0] = f"the model's forward (model_input_format={fmt!r})"
        out = call_model(model, data, fmt)
        stage[0] = "loss_func(input, output)"
        loss = loss_of(loss_func(data, out))
        stage[0] = "the backward pass"
        loss.backward()
        stage[0] = "the optimizer step"
        optim.step()
        optim.zero_grad()
        if getattr(optim, "step_was_skipped", False):
            skips.append(len(losses))
        losses.append(float(loss.detach().float()))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def expired() -> bool:  # agreed, so that every process stops before the same step
        if deadline is None:
            return False
        return _agree([1.0 if time.perf_counter() > deadline else 0.0], dist.ReduceOp.MAX, device)[0] > 0

    seconds: list[float] = []
    try:
        for batch in batches[:warmup]:
            if expired():
                return None, None, losses, seconds, skips, _TIMED_OUT
            step(batch)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        samples = 0
        for batch in batches[warmup:warmup + steps]:
            if expired():
                return None, None, losses, seconds, skips, _TIMED_OUT
            sync()
            start = time.perf_counter()
            step(batch)
            sync()
            seconds.append(time.perf_counter() - start)
            samples += _samples(batch)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
        else:
            if expired():
                return None, None, losses, seconds, skips, _TIMED_OUT
            peak = step_peak(lambda: step(batches[-1]), baseline=_held_bytes(applied._context.core, optim)).peak_bytes
            losses.pop()  # the measured step's loss belongs to no comparison (its batch may repeat)
    except AccelerateError:
        raise
    except Exception as e:  # the strategy failed to run here: a rejected candidate, not a crash
        return None, None, losses, seconds, skips, f"{stage[0]} raised {type(e).__name__}: {e}"
    total_samples, = _agree([float(samples)], dist.ReduceOp.SUM, device)
    slowest, = _agree([statistics.median(seconds) * len(seconds)], dist.ReduceOp.MAX, device)
    peak_all, = _agree([float(peak)], dist.ReduceOp.MAX, device)
    return total_samples / max(slowest, 1e-9), int(peak_all), losses, seconds, skips, None


def compare(strategy: Any, inputs: Inputs, *, baseline: DryRunResult | None = None, steps: int = 3,
            warmup: int | None = None,
            batches: Sequence[Any] | None = None, device: Any = None, world: World | None = None,
            rtol: float | None = None, seed: int = 0) -> Comparison:
    """Dry-run ``strategy`` against ``baseline`` (default: a dry run of :func:`plain_strategy` now) on
    the same batches from the same weights; the candidate is rejected beyond the loss tolerance.
    Pass the same ``batches`` that produced ``baseline``."""
    world = world or current_world()
    device = default_device(device)
    strategy = Strategy.load(strategy)
    warmup = warmup_of(strategy) if warmup is None else warmup
    if batches is None:
        batches = sample_batches(inputs, warmup + steps + (1 if device.type == "cpu" else 0), world=world)
    if baseline is None:
        baseline = dry_run(plain_strategy(world), inputs, steps=steps, warmup=warmup, batches=batches, device=device,
                           world=world, seed=seed)
    if not baseline.ok:
        failed = DryRunResult(strategy, False, reason=f"the plain run failed: {baseline.reason}")
        return Comparison(failed, baseline)
    candidate = dry_run(strategy, inputs, steps=steps, warmup=warmup, batches=batches, device=device, world=world,
                        reference=baseline, rtol=rtol, seed=seed)
    return Comparison(candidate, baseline)


__all__ = ["Comparison", "DryRunResult", "compare", "dry_run", "missing_for_dry_run", "plain_strategy",
           "sample_batches", "strategy_rtol", "warmup_of"]
