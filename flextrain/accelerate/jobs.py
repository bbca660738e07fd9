"""Strategies for flextrain jobs (``flextrain train --accelerate``, ElasticJob ``training.accelerate``).

A small helper of the job path, kept apart from ``auto_accelerate``: how the setting is written,
which methods a job takes, and how a strategy is described in logs and status. The CLI and the
operator check a setting with it at submission; the master describes it in status.json; the
workers parse it again and apply it (flextrain/worker/accelerating.py). docs/accelerate.md,
"In jobs", is the user's side.

The setting (:func:`parse_setting`) is one string:

* ``auto``: the job's first worker searches once, and every worker applies what it chose;
* a JSON strategy (:meth:`Strategy.to_json`'s object or a bare list), inline; ``flextrain train``
  reads a FILE given to ``--accelerate`` and puts its JSON in the job (errors name the file);
* a comma list of ``name`` or ``name:config``, config in a shorthand (:data:`SHORTHAND`):
  ``amp_native:bf16``, ``half:bf16``, ``checkpoint:Block`` (class names joined by ``+``),
  ``native_dynamo:eager`` / ``compile:inductor`` (the backend), ``module_replace:PairA+PairB``.

A job trains with flextrain's own data parallelism (micro-batches, a flat-buffer all-reduce,
exactly-once task accounting), so :func:`check_for_jobs` takes the single-process methods
(``amp_native`` with bf16, ``half``, ``checkpoint``, ``native_dynamo``, ``module_replace``,
``channels_last``, ``tf32``), accepts ``parallel_mode`` and ``auto_ddp`` as no-ops
(:data:`NO_OPS`) and refuses, naming the method and why, those that shard or wrap the model for
data parallelism (``zero1``, ``zero2``, ``fsdp``, ``fsdp2``), ``amp_native`` with fp16 (its loss
scaler skips steps, which would drop their records) and ``skip_if_nonfinite`` (a job's
non-finite steps follow ``--nan-policy``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flextrain.accelerate import codec
from flextrain.accelerate.errors import AccelerateError, ConfigError, UnknownMethodError

if TYPE_CHECKING:
    from flextrain.accelerate.strategy import Strategy

AUTO = "auto"
# Data parallelism that flextrain's own all-reduce already is in a job: accepted, not applied.
NO_OPS = ("parallel_mode", "auto_ddp")


def _classes(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split("+"))


# ``name:config`` in a comma list: the config text made into the method's config (others: the text as is).
SHORTHAND: dict[str, Callable[[str], Any]] = {
    "checkpoint": _classes,  # class names: checkpoint:Block+Attention
    "module_replace": lambda text: list(_classes(text)),  # pair names
    "native_dynamo": lambda text: {"backend": text},  # compile:inductor
}


def _named(message: str, what: str) -> str:
    """A strategy error as the job's setting names it (``load_strategy`` is auto_accelerate's word)."""
    if message.startswith("load_strategy"):
        return what + message.removeprefix("load_strategy")
    return message if message.startswith(what) else f"{what}: {message}"


def is_json(value: str) -> bool:
    return value.lstrip()[:1] in ("[", "{")


def parse_setting(value: Any, *, what: str = "--accelerate") -> Strategy | None:
    """The strategy a setting names (None: ``auto``); AccelerateError naming ``what`` and the method."""
    from flextrain.accelerate.methods import canonical_name  # torch: not for the master, which only describes
    from flextrain.accelerate.strategy import Strategy

    if not isinstance(value, str) or not value.strip():
        raise AccelerateError(f"{what} must be 'auto', a JSON strategy or a comma list of methods "
                              f"(e.g. amp_native:bf16,checkpoint:Block), got {value!r}")
    text = value.strip()
    if text == AUTO:
        return None
    if not is_json(text) and ("/" in text or text.endswith(".json")):
        raise AccelerateError(f"{what}: {text!r} looks like a file; a job holds its strategy inline: `flextrain "
                              "train --accelerate FILE` reads the file into it (in an ElasticJob, write the JSON "
                              "itself)")
    try:
        if is_json(text):
            return Strategy.from_json(text, argument=what)
        steps = []
        for item in text.split(","):
            name, sep, config = (part.strip() for part in item.partition(":"))
            if not name:
                raise AccelerateError(f"{what}: an empty method name in {text!r} (methods are separated by commas, "
                                      "a config follows a colon: amp_native:bf16,checkpoint:Block)")
            name = canonical_name(name, argument=what)
            if sep and not config:
                raise AccelerateError(f"{what}: {name!r} has an empty config after ':' (leave the colon out, or "
                                      "give one: amp_native:bf16)")
            steps.append((name, SHORTHAND.get(name, str)(config) if sep else None))
        return Strategy(steps, argument=what)
    except (UnknownMethodError, ConfigError) as exc:
        raise type(exc)(_named(str(exc), what)) from None
    except AccelerateError as exc:
        raise AccelerateError(_named(str(exc), what)) from None


def _refusal(name: str, config: Any) -> str | None:
    """Why a job refuses this method (None: it takes it)."""
    from flextrain.accelerate.methods import get

    method = get(name)
    if name in NO_OPS:
        return None
    if method.distributed or method.group == "sharding":
        return (f"{name} ({method.summary}) is data parallelism, which is flextrain's own in a job: the workers' "
                "micro-batch gradients are summed by flextrain's all-reduce, with the global batch fixed and every "
                f"record applied once, and {name} would replace that; use it in a script job (flextrain run) "
                "with auto_accelerate, or leave it out")
    if name == "amp_native" and config["dtype"] == "fp16":
        return ("amp_native with fp16 (also its default, ATorch's, when no config is given) needs a loss "
                "scaler (GradScaler), which skips every step whose scaled gradients overflow while it calibrates; "
                "in a job a skipped step would drop its records (every record is applied once): use "
                "amp_native:bf16, which needs no scaling")
    if name == "amp_native" and config["skip_if_nonfinite"]:
        return ("amp_native's skip_if_nonfinite would skip steps behind the job's back: a job's non-finite steps "
                "follow --nan-policy (skip-step drops them, counted in status); leave skip_if_nonfinite out")
    return None


def check_for_jobs(strategy: Strategy, *, what: str = "--accelerate") -> Strategy:
    """``strategy`` if a job can apply it, else AccelerateError naming the method and why (module docstring)."""
    for step in strategy:
        why = _refusal(step.name, step.config)
        if why is not None:
            raise AccelerateError(f"{what}: {why}")
    return strategy


def applied_in_jobs(strategy: Strategy) -> Strategy:
    """The methods a job applies: ``strategy`` without the no-ops (:data:`NO_OPS`)."""
    return strategy.without(*NO_OPS) if any(n in strategy.names for n in NO_OPS) else strategy


def job_candidate(strategy: Strategy) -> bool:
    """Whether a job may apply ``strategy`` (the automatic search's filter)."""
    return all(_refusal(s.name, s.config) is None and s.name not in NO_OPS for s in strategy)


def check_setting(value: Any, *, what: str = "--accelerate") -> Strategy | None:
    """:func:`parse_setting` then :func:`check_for_jobs`: what submission runs (None: auto)."""
    strategy = parse_setting(value, what=what)
    return None if strategy is None else check_for_jobs(strategy, what=what)


# ---- descriptions (logs, status.json): from a Strategy or from its JSON, resolving no class ----------------

def _short(name: str, config: Any) -> str:
    """``name`` or ``name:config`` in the comma list's shorthand where it has one, else the config as JSON."""
    if config is None:
        return name
    if name == "amp_native" and isinstance(config, dict) and not config.get("skip_if_nonfinite"):
        return f"{name}:{config.get('dtype')}"
    if name in ("half", "amp_native") and isinstance(config, str):
        return f"{name}:{config}"
    if name == "checkpoint" and isinstance(config, list | tuple):
        config = {"wrap_class": config}
    if name == "checkpoint" and isinstance(config, dict) and config.get("no_reentrant", True) \
            and set(config) <= {"wrap_class", "no_reentrant"}:
        classes = [c["__class__"].rsplit(":", 1)[-1].rsplit(".", 1)[-1] if isinstance(c, dict) else str(c)
                   for c in config.get("wrap_class") or ()]
        return f"{name}:{'+'.join(classes)}"
    if name == "native_dynamo" and isinstance(config, dict) and set(config) == {"backend"}:
        return f"{name}:{config['backend']}"
    if name == "module_replace" and isinstance(config, dict) and all(v is None for v in config.values()):
        return f"{name}:{'+'.join(config)}"
    return f"{name}:{json.dumps(config, separators=(',', ':'), sort_keys=True)}"


def describe(strategy: Strategy) -> str:
    """``amp_native:bf16, checkpoint:Block`` (``no methods`` for an empty strategy)."""
    return ", ".join(_short(s.name, codec.encode(s.config)) for s in strategy) or "no methods"


def methods_of_json(text: str) -> list[dict[str, Any]]:
    """``[{"name", "config"}]`` of a saved strategy's JSON as written (classes left as their paths)."""
    doc = json.loads(text)
    items = doc.get("methods", []) if isinstance(doc, dict) else doc
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            out.append({"name": item.get("name"), "config": item.get("config")})
        elif isinstance(item, list) and len(item) == 2:
            out.append({"name": item[0], "config": item[1]})
        else:
            out.append({"name": item, "config": None})
    return out


def describe_json(text: str) -> str:
    """:func:`describe` of a strategy's JSON, resolving no class (the master imports no user module)."""
    try:
        return ", ".join(_short(str(m["name"]), m["config"]) for m in methods_of_json(text)) or "no methods"
    except (ValueError, TypeError, AttributeError):
        return text


def describe_setting(value: str) -> str:
    """A setting as status.json shows it: ``auto``, the comma list as given, or a JSON strategy described."""
    text = value.strip()
    return describe_json(text) if is_json(text) else text


__all__ = ["AUTO", "NO_OPS", "SHORTHAND", "applied_in_jobs", "check_for_jobs", "check_setting", "describe",
           "describe_json", "describe_setting", "is_json", "job_candidate", "methods_of_json", "parse_setting"]
