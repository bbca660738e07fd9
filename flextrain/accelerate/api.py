"""``auto_accelerate``: ATorch's API over flextrain's methods, strategies and dry runs.

Semi-automatic mode (``load_strategy`` given) applies the strategy loaded (after a dry run or a
finetuning, if asked). Fully automatic mode (``load_strategy=None``) chooses one with
:func:`flextrain.accelerate.search.search`. Everything around the choice (the final apply,
saving, the report) is shared by both.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flextrain.accelerate.apply import apply_strategy, check_strategy, current_world, default_device
from flextrain.accelerate.context import Inputs
from flextrain.accelerate.dryrun import DryRunResult, compare, dry_run, missing_for_dry_run, plain_strategy, \
    sample_batches
from flextrain.accelerate.errors import AccelerateError
from flextrain.accelerate.methods import canonical_name
from flextrain.accelerate.results import SearchResult
from flextrain.accelerate.search import SEARCH_STEPS, search
from flextrain.accelerate.strategy import Strategy
from flextrain.elastic.world import World

log = logging.getLogger(__name__)

# ATorch kwargs that have no meaning here: accepted with a warning, so ATorch scripts still run.
_ATORCH_IGNORED = frozenset({"meta_init_offload_name", "batch_size", "expand_sample_batch"})
FINETUNE_MARGIN = 1.05  # a variation replaces the loaded strategy only when this much faster
LOADED_DRY_RUN_STEPS = 3  # timed steps of a loaded strategy's dry runs (the search's: SEARCH_STEPS)


@dataclass(frozen=True)
class Options:
    """``auto_accelerate``'s keyword-only extras: ATorch's ``verbose``, ``time_limit``,
    ``find_unused_parameters``, ``sample_batch``, ``sampler_seed``, and flextrain's ``device``,
    ``skip_unavailable`` and ``dry_run_steps`` (timed steps per dry run; None: 3 for a loaded
    strategy, :data:`~flextrain.accelerate.search.SEARCH_STEPS` in the search)."""

    verbose: bool = False
    time_limit: float | None = None
    find_unused_parameters: bool = False
    sample_batch: Any = None
    sampler_seed: int = 0
    device: Any = None
    skip_unavailable: bool = False
    dry_run_steps: int | None = None

    @classmethod
    def of(cls, kwargs: dict[str, Any]) -> Options:
        known = set(cls.__dataclass_fields__)
        for name in sorted(set(kwargs) - known):
            if name in _ATORCH_IGNORED:
                log.warning("auto_accelerate: ATorch's %s=%r has no meaning in flextrain and is ignored",
                            name, kwargs[name])
            else:
                raise TypeError(f"auto_accelerate() got an unexpected keyword argument {name!r} "
                                f"(known: {', '.join(sorted(known))})")
        opts = cls(**{k: v for k, v in kwargs.items() if k in known})
        for name in ("verbose", "skip_unavailable"):
            if not isinstance(getattr(opts, name), bool):
                raise AccelerateError(f"{name} must be True or False, got {getattr(opts, name)!r}")
        t = opts.time_limit
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or t <= 0):
            raise AccelerateError(f"time_limit must be a number of seconds > 0, got {t!r}")
        n = opts.dry_run_steps
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise AccelerateError(f"dry_run_steps must be a positive integer, got {n!r}")
        return opts


def _method_names(argument: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence | set | frozenset):
        raise AccelerateError(f"{argument} must be a list of optimization method names, got {value!r}")
    return tuple(canonical_name(v, argument=argument) for v in value)


def _finetune(strategy: Strategy, inputs: Inputs, *, device: torch.device, world: World, steps: int,
              skip_unavailable: bool) -> tuple[Strategy | None, DryRunResult | None, tuple[DryRunResult, ...]]:
    """The loaded strategy and its :meth:`Strategy.variations`, each dry-run against one plain run
    on the same batches; the fastest accepted one wins, the loaded one unless another is
    :data:`FINETUNE_MARGIN` faster."""
    batches = sample_batches(inputs, 1 + steps + (1 if device.type == "cpu" else 0), world=world)
    baseline = dry_run(plain_strategy(world), inputs, steps=steps, batches=batches, device=device, world=world)
    if not baseline.ok:
        return None, None, (baseline,)
    tried = tuple(dry_run(c, inputs, steps=steps, batches=batches, device=device, world=world, reference=baseline,
                          skip_unavailable=skip_unavailable) for c in [strategy, *strategy.variations()])
    accepted = [r for r in tried if r.ok]
    if not accepted:
        return None, None, tried
    best = accepted[0]
    for r in accepted[1:]:
        if r.samples_per_second > best.samples_per_second * (FINETUNE_MARGIN if best is tried[0] else 1.0):
            best = r
    return best.strategy, best, tried


def auto_accelerate(model: torch.nn.Module, optim_func: Any = None, dataset: Any = None, loss_func: Any = None,
                    prepare_input: Any = None, model_input_format: str | None = None, optim_args: Any = None,
                    optim_param_func: Any = None, dataloader_args: Any = None, distributed_sampler_cls: Any = None,
                    excluded: Any = None, included: Any = None, load_strategy: Any = None,
                    ignore_dryrun_on_load_strategy: bool | None = None, finetune_strategy: bool = False,
                    save_strategy_to_file: Any = None, lr_scheduler_cls: Any = None, lr_scheduler_args: Any = None,
                    **kwargs: Any) -> tuple[bool, Any, Strategy | None]:
    """Accelerate training of ``model``; ATorch's API (docs/accelerate.md has the details).

    Returns ``(status, result, best_strategy)``: ``result`` is the namedtuple ``(model, optim,
    dataloader, loss_func, prepare_input, lr_scheduler, args)`` (``args``: the
    :class:`~flextrain.accelerate.context.Report`), ``best_strategy`` the :class:`Strategy` as
    applied. ``status`` is False (with ``None, None``) when the dry run of a loaded strategy fails
    or finetuning finds no strategy that runs; bad arguments raise :class:`AccelerateError`
    naming the argument, and a method asked for that cannot apply here raises
    :class:`~flextrain.accelerate.errors.UnavailableMethodError` (``skip_unavailable=True`` skips
    it and lists it in the report instead).

    - ``optim_func``: an optimizer class or ``f(parameters, **optim_args)``; ``optim_param_func(model)``
      gives parameter groups instead of ``model.parameters()``.
    - ``dataset`` + ``dataloader_args``: ``batch_size`` is the global batch, split over the
      processes (:mod:`flextrain.accelerate.data`); ``distributed_sampler_cls`` replaces
      ``DistributedSampler``.
    - ``loss_func(input, output)`` returns the loss or a tuple starting with it;
      ``prepare_input(data, device)`` (default: move tensors to the device); ``model_input_format``
      None (``model(data)``), ``"unpack_sequence"`` (``model(*data)``), ``"unpack_dict"`` (``model(**data)``).
    - ``load_strategy``: method names and ``(name, config)`` pairs, a Strategy, JSON text/bytes or
      a JSON file path. None: fully automatic mode (:func:`flextrain.accelerate.search.search`;
      ``result.args.search`` holds every candidate's figures, ``verbose=True`` prints them).
    - ``ignore_dryrun_on_load_strategy`` (default True when a strategy is loaded, as ATorch):
      False dry-runs the loaded strategy against a plain run first. ``finetune_strategy`` dry-runs
      variations of it and keeps the fastest. ``save_strategy_to_file`` writes the result as JSON.
    - ``excluded``/``included``/``time_limit`` (seconds, default
      :data:`~flextrain.accelerate.search.DEFAULT_TIME_LIMIT`) steer the automatic search; kwargs:
      see :class:`Options`.
    """
    opts = Options.of(kwargs)
    inputs = Inputs.checked(model, optim_func=optim_func, dataset=dataset, loss_func=loss_func,
                            prepare_input=prepare_input, model_input_format=model_input_format, optim_args=optim_args,
                            optim_param_func=optim_param_func, dataloader_args=dataloader_args,
                            distributed_sampler_cls=distributed_sampler_cls, lr_scheduler_cls=lr_scheduler_cls,
                            lr_scheduler_args=lr_scheduler_args, find_unused_parameters=opts.find_unused_parameters,
                            sample_batch=opts.sample_batch, sampler_seed=opts.sampler_seed)
    excluded_names, included_names = _method_names("excluded", excluded), _method_names("included", included)
    for name, value in (("finetune_strategy", finetune_strategy),
                        ("ignore_dryrun_on_load_strategy", ignore_dryrun_on_load_strategy)):
        if value is not None and not isinstance(value, bool):
            raise AccelerateError(f"{name} must be True or False, got {value!r}")
    device, world = default_device(opts.device), current_world()
    dry: DryRunResult | None = None
    tried: tuple[DryRunResult, ...] = ()
    found: SearchResult | None = None
    loaded_steps = opts.dry_run_steps or LOADED_DRY_RUN_STEPS
    if load_strategy is None:
        missing = missing_for_dry_run(inputs)
        if missing:
            raise AccelerateError(f"fully automatic mode (load_strategy=None) runs dry runs, which need "
                                  f"{', '.join(missing)}; or give load_strategy for the semi-automatic mode")
        found = search(inputs, device=device, world=world, excluded=excluded_names, included=included_names,
                       time_limit=opts.time_limit, steps=opts.dry_run_steps or SEARCH_STEPS,
                       skip_unavailable=opts.skip_unavailable)
        if opts.verbose and world.rank == 0:
            found.print()
        strategy, tried = found.strategy, found.tried
        dry = found.chosen.best_run if found.chosen is not None else None
    else:
        strategy = Strategy.load(load_strategy)
        check_strategy(strategy, inputs.model, device, world, skip_unavailable=opts.skip_unavailable)
        if finetune_strategy:
            missing = missing_for_dry_run(inputs)
            if missing:
                raise AccelerateError(f"finetune_strategy=True runs dry runs, which need {', '.join(missing)}")
            strategy, dry, tried = _finetune(strategy, inputs, device=device, world=world, steps=loaded_steps,
                                             skip_unavailable=opts.skip_unavailable)
        elif ignore_dryrun_on_load_strategy is False:
            missing = missing_for_dry_run(inputs)
            if missing:
                log.warning("auto_accelerate: dry run skipped, it needs %s", ", ".join(missing))
            else:
                dry = compare(strategy, inputs, steps=loaded_steps, device=device, world=world).candidate
                tried = (dry,)
                strategy = dry.strategy if dry.ok else None
    if strategy is None:
        for r in tried:
            log.error("auto_accelerate: %s", r.describe())
        return False, None, None
    applied = apply_strategy(strategy, inputs, device=device, world=world, skip_unavailable=opts.skip_unavailable)
    report = applied.report.replace(dry_run=dry, tried=tried if finetune_strategy or load_strategy is None else (),
                                    search=found)
    if found is not None and found.skipped:
        report = report.replace(skipped=(*report.skipped, *found.skipped))
    if save_strategy_to_file is not None:
        report.strategy.save(save_strategy_to_file)
    if opts.verbose:
        log.info("auto_accelerate:\n%s\n%s", report.strategy, report)
    else:
        log.info("auto_accelerate: %s", ", ".join(report.strategy.names) or "no methods")
    return True, applied.result._replace(args=report), report.strategy


__all__ = ["FINETUNE_MARGIN", "Options", "auto_accelerate"]
