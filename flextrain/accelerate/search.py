"""The fully automatic mode: choose a strategy by dry runs, within a time limit.

:func:`search` is what ``auto_accelerate(load_strategy=None)`` runs. Its rules:

1. **The base.** Every candidate starts from the plain strategy (nothing; ``parallel_mode``, i.e.
   DDP, when several processes train) plus the ``included`` methods (each with its first search
   config). The plain run is every candidate's reference: the same batches (drawn once) from the
   same weights and seed, and its per-step losses.
2. **Single methods.** Every registered method not ``excluded`` and not in the base offers its
   :meth:`~flextrain.accelerate.methods.base.Method.candidates` for this model, device and world
   (none where its ``check`` refuses: distributed methods in a world of one process, ``tf32`` off
   CUDA, ``channels_last`` without convolutions, ``module_replace`` without a replaceable module;
   ``amp_native``/``half`` offer bf16, and fp16 on CUDA; ``checkpoint`` the model's repeated block
   class; ``parallel_mode``/``auto_ddp`` nothing, being the base or a no-op). One that conflicts
   with the base (``half`` when ``amp_native`` is included) is pruned. Each is dry-run on top of
   the base, cheap ones first (compiled candidates last).
3. **Combinations that helped.** A candidate *helped* when it was accepted and ran at least
   :data:`HELPS` times the base's samples/s and, if it combines methods, :data:`HELPS` times each
   combination it was built from (its figure: the best of its runs). A single method that did not
   help runs a second time (not a compiled one: compiling again costs too much), since a busy
   moment on a shared machine may have hidden it. Pairs are made of singles that helped, triples of pairs that
   all helped, and so on (an Apriori-style enumeration), never two methods of one group
   (:func:`~flextrain.accelerate.strategy.conflict`).
4. **Finals.** The :data:`FINALISTS` fastest accepted candidates run again; a candidate's figure
   is the best of its runs (noise on a shared machine only slows a run down), and a rerun that
   breaks training rejects it.
5. **The pick** is the accepted candidate with the highest figure (ties: fewer methods); the base
   when nothing beats it. None when the plain run or the base is rejected.

A candidate is rejected when applying or running it raises (a CUDA out-of-memory error
included), a loss is not finite, or a step's loss is off the plain run's by more than its
tolerance (:func:`~flextrain.accelerate.dryrun.strategy_rtol`).

**Time limit** (default :data:`DEFAULT_TIME_LIMIT` seconds, from the search's start): the plain
and base runs always complete; a candidate starts only when its predicted duration (its parts'
dry runs, at least the plain run's) fits in what is left, and a dry run under way stops between
steps at the limit (a step in progress, e.g. one that compiles, finishes first). Candidates left
out or stopped are listed with status ``time limit``, and the best accepted so far is picked.

**Several processes**: every dry-run figure is agreed over the processes already (the slowest
process's time, the largest peak, a rejection anywhere rejects), every time decision uses the
largest elapsed time of any process, and rank 0's pick is broadcast, so every process applies
the same strategy.

``torch._dynamo`` is reset before every compiled candidate and after the search (its recompile
limit of 8 per function would otherwise make later compiled candidates fall back to eager and
look slow); this drops the compiled code of anything else the process compiled before.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from flextrain.accelerate.context import Inputs, Skipped
from flextrain.accelerate.dryrun import DryRunResult, _agree, dry_run, plain_strategy, sample_batches, warmup_of
from flextrain.accelerate.errors import AccelerateError, ConfigError, UnavailableMethodError
from flextrain.accelerate.methods import get, names
from flextrain.accelerate.results import ACCEPTED, PICKED, REJECTED, TIME_LIMIT, Candidate, SearchResult, describe
from flextrain.accelerate.strategy import Step, Strategy, conflict
from flextrain.elastic.world import World

log = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT = 300.0  # seconds, when auto_accelerate's time_limit is None
SEARCH_STEPS = 5  # timed steps of each dry run (auto_accelerate's dry_run_steps overrides)
HELPS = 1.03  # a candidate "helped" at this many times the samples/s of the base and of its parts
FINALISTS = 3  # the fastest accepted candidates that run a second time

COMPILE = "native_dynamo"


# ---- candidates ----------------------------------------------------------------------------------

def _first_config(name: str, model: torch.nn.Module, device: torch.device, world: World) -> Any:
    method = get(name)
    configs = method.candidates(model, device, world)
    if configs:
        return configs[0]
    try:
        return method.validate(None)
    except ConfigError:
        raise AccelerateError(f"included: {name!r} needs a config the search cannot choose; give it with "
                              f"load_strategy (the semi-automatic mode)") from None


def base_strategy(model: torch.nn.Module, device: torch.device, world: World, *, excluded: Sequence[str] = (),
                  included: Sequence[str] = (), skip_unavailable: bool = False) -> tuple[Strategy, list[Skipped]]:
    """The plain strategy plus the ``included`` methods (each with its first search config), and the
    included methods skipped because they cannot apply (``skip_unavailable``; else that raises)."""
    both = sorted(set(excluded) & set(included))
    if both:
        raise AccelerateError(f"{', '.join(both)} cannot be both excluded and included")
    plain = plain_strategy(world)
    if world.processes > 1 and "parallel_mode" in excluded:
        raise AccelerateError(f"excluded: parallel_mode is the data parallelism of the {world.processes} "
                              "processes and is in every candidate; it cannot be excluded")
    steps, skipped = list(plain.steps), []
    for name in dict.fromkeys(included):
        if name in plain.names:
            continue
        reason = get(name).check(model, device, world)
        if reason is not None:
            if not skip_unavailable:
                raise UnavailableMethodError(name, reason)
            skipped.append(Skipped(name, reason))
            continue
        steps.append(Step(name, _first_config(name, model, device, world)))
    problem = conflict(s.name for s in steps)
    if problem is not None:
        raise AccelerateError(f"included: {problem}")
    return Strategy(steps, argument="included"), skipped


def single_steps(model: torch.nn.Module, device: torch.device, world: World, base: Strategy, *,
                 excluded: Sequence[str] = ()) -> list[Step]:
    """The methods (with configs) the search tries on top of ``base``: every registered method's
    search candidates, less the excluded ones, those in the base and those that conflict with it;
    cheap ones first (the compiled last)."""
    out = []
    for name in names():
        if name in excluded or name in base.names or conflict([*base.names, name]) is not None:
            continue
        out.extend(Step(name, config) for config in get(name).candidates(model, device, world))
    return sorted(out, key=lambda s: (s.name == COMPILE, get(s.name).warmup_steps))


# ---- the search ----------------------------------------------------------------------------------

class _Search:
    def __init__(self, inputs: Inputs, *, device: torch.device, world: World, steps: int, time_limit: float,
                 batches: list[Any]) -> None:
        self.inputs, self.device, self.world, self.steps = inputs, device, world, steps
        self.time_limit, self.batches = time_limit, batches
        self.start = time.perf_counter()
        self.deadline = self.start + time_limit
        self.candidates: list[Candidate] = []
        self.stopped_early = False
        self.notes: list[str] = []
        self.compiled = False
        self.reference: DryRunResult | None = None

    def elapsed(self) -> float:
        """Seconds since the start, the largest over the processes (so that all decide alike)."""
        return _agree([time.perf_counter() - self.start], dist.ReduceOp.MAX, self.device)[0]

    def _dry_run(self, strategy: Strategy, *, deadline: float | None) -> DryRunResult:
        if COMPILE in strategy.names:
            torch._dynamo.reset()
            self.compiled = True
        result = dry_run(strategy, self.inputs, steps=self.steps, batches=self.batches, device=self.device,
                         world=self.world, reference=self.reference, skip_unavailable=False, deadline=deadline)
        if self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
        log.info("auto_accelerate search: %s (%.2f s)", result.describe(), result.wall_seconds or 0.0)
        return result

    def run(self, strategy: Strategy, round_: int, *, predicted: float | None = None,
            required: bool = False) -> Candidate:
        """Dry-run ``strategy`` once as a new candidate (``required``: whatever the time limit)."""
        if not required:
            left = self.time_limit - self.elapsed()
            if predicted is not None and predicted > left:
                self.stopped_early = True
                why = f"not run: needs ~{predicted:.1f} s, {max(left, 0.0):.1f} s left"
                return self._add(Candidate(strategy, round_, TIME_LIMIT, reason=why))
        result = self._dry_run(strategy, deadline=None if required else self.deadline)
        if result.timed_out:
            self.stopped_early = True
            return self._add(Candidate(strategy, round_, TIME_LIMIT, (result,), result.reason))
        status = ACCEPTED if result.ok else REJECTED
        return self._add(Candidate(strategy, round_, status, (result,), result.reason))

    def rerun(self, index: int, *, required: bool = False) -> None:
        """Dry-run candidate ``index`` again (the finals): its figure becomes the best of its runs."""
        c = self.candidates[index]
        left = self.time_limit - self.elapsed()
        if not required and c.run_seconds > left:
            self.stopped_early = True
            self.notes.append(f"{c.label}: no second run (needs ~{c.run_seconds:.1f} s, {max(left, 0):.1f} s left)")
            return
        result = self._dry_run(c.strategy, deadline=None if required else self.deadline)
        if result.timed_out:
            self.stopped_early = True
            self.notes.append(f"{c.label}: second run {result.reason}")
            return
        if result.ok:
            self.candidates[index] = Candidate(c.strategy, c.round, c.status, (*c.runs, result), c.reason)
        else:
            self.candidates[index] = Candidate(c.strategy, c.round, REJECTED, (*c.runs, result),
                                               f"rejected on its second run: {result.reason}")

    def _add(self, candidate: Candidate) -> Candidate:
        self.candidates.append(candidate)
        return candidate

    def predicted(self, strategy: Strategy, parts: list[Candidate]) -> float:
        """A first run's duration, guessed: the longest of its parts' runs, at least the plain run's
        (and, for a compiled candidate, at least any compiled run's so far)."""
        walls = [self.candidates[0].run_seconds, *(p.run_seconds for p in parts)]
        if COMPILE in strategy.names:
            walls += [r.wall_seconds or 0.0 for c in self.candidates for r in c.runs if COMPILE in c.strategy.names]
        return max(walls)


def _helped(c: Candidate, base: Candidate, parts: list[Candidate]) -> bool:
    sps = c.samples_per_second
    return sps is not None and all(p.samples_per_second is not None and sps >= HELPS * p.samples_per_second
                                   for p in [base, *parts])


def search(inputs: Inputs, *, device: torch.device, world: World, excluded: Sequence[str] = (),
           included: Sequence[str] = (), time_limit: float | None = None, steps: int = SEARCH_STEPS,
           skip_unavailable: bool = False) -> SearchResult:
    """Choose a strategy for ``inputs`` by dry runs (the rules are in the module docstring)."""
    import torch._dynamo  # noqa: F401  (a one-off second or so: not the search's own time)

    limit = DEFAULT_TIME_LIMIT if time_limit is None else float(time_limit)
    model = inputs.model
    base, skipped = base_strategy(model, device, world, excluded=excluded, included=included,
                                  skip_unavailable=skip_unavailable)
    singles = single_steps(model, device, world, base, excluded=excluded)
    warmup = max([warmup_of(base)] + [get(s.name).warmup_steps for s in singles])
    batches = sample_batches(inputs, warmup + steps + (1 if device.type == "cpu" else 0), world=world)
    s = _Search(inputs, device=device, world=world, steps=steps, time_limit=limit, batches=batches)

    plain = s.run(plain_strategy(world), 0, required=True)
    if plain.accepted:
        s.reference = plain.runs[0]
        s.rerun(0, required=True)  # its first run paid the process's one-off costs: a second one to predict from
        plain = s.candidates[0]
        base_c = plain if base == plain.strategy else s.run(base, 0, required=True)
        if base_c.accepted:
            _rounds(s, base, base_c, singles)
            _finals(s)
    # the plain run is a candidate too, unless the base has included methods it lacks
    accepted = [(i, c) for i, c in enumerate(s.candidates) if c.accepted and set(base.names) <= set(c.strategy.names)]
    chosen = None
    if accepted:
        best = max(accepted, key=lambda ic: (ic[1].samples_per_second, -len(ic[1].strategy), -ic[0]))[0]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            t = torch.tensor([best], dtype=torch.int64, device=device if device.type == "cuda" else "cpu")
            dist.broadcast(t, src=0)  # rank 0's decision (the figures are agreed already)
            best = int(t.item())
        c = s.candidates[best]
        s.candidates[best] = chosen = Candidate(c.strategy, c.round, PICKED, c.runs, c.reason)
    if s.compiled:
        torch._dynamo.reset()  # the final apply compiles afresh
    return SearchResult(tuple(s.candidates), chosen, s.elapsed(), limit, s.stopped_early, steps, tuple(skipped),
                        tuple(s.notes))


def _rounds(s: _Search, base: Strategy, base_c: Candidate, singles: list[Step]) -> None:
    """Single methods, then combinations of those that helped (module docstring, rules 2 and 3).
    A combination is a sorted tuple of indices into ``singles`` (configs need not be hashable)."""
    by_combo: dict[tuple[int, ...], int] = {}  # -> index in s.candidates
    level: list[tuple[int, ...]] = [(i,) for i in range(len(singles))]
    helped_singles: list[int] = []
    size = 1
    while level:
        for combo in level:
            parts = [s.candidates[by_combo[p]] for p in itertools.combinations(combo, size - 1)] if size > 1 else []
            strategy = Strategy([*base.steps, *(singles[i] for i in combo)])
            s.run(strategy, size, predicted=s.predicted(strategy, parts))
            by_combo[combo] = len(s.candidates) - 1
        if size == 1:  # a second chance for singles a busy moment may have hidden (not compiled ones: costly)
            for (i,) in level:
                c = s.candidates[by_combo[(i,)]]
                if c.accepted and not _helped(c, base_c, []) and COMPILE not in c.strategy.names:
                    s.rerun(by_combo[(i,)])
        helped = [combo for combo in level if _helped(s.candidates[by_combo[combo]], base_c,
                                                      [s.candidates[by_combo[p]]
                                                       for p in itertools.combinations(combo, size - 1)]
                                                      if size > 1 else [])]
        if size == 1:
            helped_singles = [i for (i,) in helped]
        size += 1
        level = [combo for combo in _next_level(helped, helped_singles, singles) if combo not in by_combo]


def _next_level(helped: list[tuple[int, ...]], helped_singles: list[int],
                singles: list[Step]) -> list[tuple[int, ...]]:
    """Combinations one method larger whose every one-smaller part helped, without conflicts
    (cheap first: compiled ones last)."""
    found = set(helped)
    out: set[tuple[int, ...]] = set()
    for combo in helped:
        for i in helped_singles:
            union = tuple(sorted({*combo, i}))
            if len(union) == len(combo) or union in out or conflict(singles[j].name for j in union) is not None:
                continue
            if all(p in found for p in itertools.combinations(union, len(combo))):
                out.add(union)
    return sorted(out, key=lambda c: (any(singles[j].name == COMPILE for j in c), c))


def _finals(s: _Search) -> None:
    """The fastest accepted candidates run again (rule 4)."""
    accepted = sorted((i for i, c in enumerate(s.candidates) if c.accepted),
                      key=lambda i: -s.candidates[i].samples_per_second)
    if len(accepted) < 2:
        return
    for i in accepted[:FINALISTS]:
        if len(s.candidates[i].runs) == 1:  # the plain run has had its second already
            s.rerun(i)


__all__ = ["ACCEPTED", "Candidate", "DEFAULT_TIME_LIMIT", "FINALISTS", "HELPS", "PICKED", "REJECTED", "SEARCH_STEPS",
           "SearchResult", "TIME_LIMIT", "base_strategy", "describe", "search", "single_steps"]
