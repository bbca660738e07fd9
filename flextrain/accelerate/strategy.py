"""A strategy: an ordered list of optimization methods with their configs, validated and comparable.

Built from any of the forms ``auto_accelerate(load_strategy=...)`` accepts (:meth:`Strategy.load`):
a list of names and ``(name, config)`` pairs (``["parallel_mode", ("amp_native", "bf16")]``), a
:class:`Strategy`, or a saved strategy as JSON text, UTF-8 JSON bytes or a file path. Saved
strategies are JSON only (:meth:`Strategy.to_json`; classes by import path, see
:mod:`flextrain.accelerate.codec`), never pickle: ATorch's pickled files are refused with a message.

Every step is validated when the strategy is made: the name is registered (aliases become the
canonical name: ``compile`` is ``native_dynamo``), the config is turned into its canonical form by
the method's ``validate``, a method appears once, and at most one method of a group is present
(``amp_native`` or ``half``; one of ``zero1``/``zero2``/``fsdp``/``fsdp2``). So two strategies
that mean the same compare equal, and ``Strategy.from_json(s.to_json()) == s``.

The automatic search builds candidates with :meth:`Strategy.with_step`, ``+`` and
:func:`conflict` (pre-filtering combinations without raising).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from flextrain.accelerate import codec
from flextrain.accelerate.errors import AccelerateError
from flextrain.accelerate.methods import registry

FORMAT = "flextrain.accelerate.strategy/1"


class Step(NamedTuple):
    """One method of a strategy: ``(name, config)`` (unpacks like ATorch's pairs)."""

    name: str
    config: Any = None


def conflict(names: Iterable[str]) -> str | None:
    """Why these methods cannot be in one strategy (a repeated method, two of one group), or None."""
    seen: dict[str, str] = {}
    groups: dict[str, str] = {}
    for raw in names:
        name = registry.canonical_name(raw)
        if name in seen:
            return f"{name!r} appears twice" + (f" (as {seen[name]!r} and {raw!r})" if seen[name] != raw else "")
        seen[name] = raw
        group = registry.get(name).group
        if group is not None:
            if group in groups:
                return f"{groups[group]!r} and {name!r} cannot be combined (both are {group} methods)"
            groups[group] = name
    return None


def _step(item: Any, index: int, argument: str) -> Step:
    if isinstance(item, str):
        name, config = item, None
    elif isinstance(item, list | tuple) and len(item) == 2:
        name, config = item
    else:
        raise AccelerateError(f"{argument}[{index}] must be a method name or a (name, config) pair, got {item!r}")
    method = registry.get(name, argument=f"{argument}[{index}]")
    return Step(method.name, method.validate(config))


@dataclass(frozen=True, eq=False)
class Strategy:
    """An immutable, validated list of :class:`Step`. ``Strategy(["half", ("checkpoint", (Block,))])``."""

    steps: tuple[Step, ...] = ()

    def __init__(self, steps: Iterable[Any] = (), *, argument: str = "load_strategy") -> None:
        if isinstance(steps, str | bytes) or not isinstance(steps, Iterable):
            raise AccelerateError(f"{argument} must be a list of method names and (name, config) pairs, "
                                  f"got {type(steps).__name__}")
        made = tuple(_step(item, i, argument) for i, item in enumerate(steps))
        problem = conflict(s.name for s in made)
        if problem is not None:
            raise AccelerateError(f"{argument}: {problem}")
        object.__setattr__(self, "steps", made)

    # ---- reading -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index: int) -> Step:
        return self.steps[index]

    def __contains__(self, name: object) -> bool:
        """``"compile" in strategy``: a method name or alias."""
        return isinstance(name, str) and any(name in (s.name, *registry.get(s.name).aliases) for s in self.steps)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def opt_names(self) -> list[str]:
        """ATorch's spelling of :attr:`names`."""
        return list(self.names)

    def config(self, name: str, default: Any = None) -> Any:
        """The config of method ``name`` (an alias works), or ``default`` when absent."""
        name = registry.canonical_name(name)
        return next((s.config for s in self.steps if s.name == name), default)

    # ---- making new ones -------------------------------------------------------------------
    def with_step(self, name: str, config: Any = None) -> Strategy:
        """This strategy with ``name`` set to ``config``: replaced in place if present, else appended."""
        name = registry.canonical_name(name)
        if name in self.names:
            return Strategy([(s.name, config) if s.name == name else s for s in self.steps])
        return Strategy([*self.steps, (name, config)])

    def without(self, *names: str) -> Strategy:
        drop = {registry.canonical_name(n) for n in names}
        return Strategy([s for s in self.steps if s.name not in drop])

    def __add__(self, other: Any) -> Strategy:
        """Both strategies' methods; where both have a method, ``other``'s config wins."""
        other = other if isinstance(other, Strategy) else Strategy(other)
        out = self
        for step in other:
            out = out.with_step(step.name, step.config)
        return out

    def variations(self) -> list[Strategy]:
        """This strategy with one method's config changed to one of its ``neighbours`` (finetuning)."""
        return [self.with_step(s.name, c) for s in self.steps for c in registry.get(s.name).neighbours(s.config)]

    # ---- equality and printing -------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Strategy):
            return NotImplemented
        return self.steps == other.steps

    def __hash__(self) -> int:
        return hash(self.names)

    def __repr__(self) -> str:
        return f"Strategy({[s.name if s.config is None else (s.name, s.config) for s in self.steps]!r})"

    def __str__(self) -> str:
        lines = [f"Acceleration strategy has {len(self)} optimization methods"]
        lines += [f"[{i}] {s.name}" + ("" if s.config is None else f" : {s.config}") for i, s in enumerate(self.steps)]
        return "\n".join(lines)

    # ---- JSON --------------------------------------------------------------------------------
    def to_json(self, *, indent: int | None = 2) -> str:
        doc = {"format": FORMAT,
               "methods": [{"name": s.name, "config": codec.encode(s.config, where=f"config of {s.name!r}")}
                           for s in self.steps]}
        return json.dumps(doc, indent=indent)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_json` to ``path`` (atomically: a temporary file renamed over it)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # processes may save the same file
        tmp.write_text(self.to_json() + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def from_json(cls, text: str, *, argument: str = "load_strategy") -> Strategy:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise AccelerateError(f"{argument} is not a JSON strategy: {e}") from None
        if isinstance(doc, dict):
            if doc.get("format") != FORMAT or not isinstance(doc.get("methods"), list):
                raise AccelerateError(f"{argument}: a JSON strategy object needs \"format\": {FORMAT!r} and a "
                                      "\"methods\" list")
            items = []
            for i, m in enumerate(doc["methods"]):
                if not isinstance(m, dict) or set(m) - {"name", "config"} or "name" not in m:
                    raise AccelerateError(f"{argument}: methods[{i}] must be {{\"name\": ..., \"config\": ...}}, "
                                          f"got {m!r}")
                items.append((m["name"], codec.decode(m.get("config"), where=f"{argument}: config of {m['name']!r}")))
        elif isinstance(doc, list):
            items = codec.decode(doc, where=argument)
        else:
            raise AccelerateError(f"{argument}: JSON strategy must be an object or a list, got {type(doc).__name__}")
        return cls(items, argument=argument)

    @classmethod
    def load(cls, value: Any, *, argument: str = "load_strategy") -> Strategy:
        """A strategy from any accepted form (module docstring). A string is JSON text when it
        starts with ``[`` or ``{``, else a file path."""
        if isinstance(value, Strategy):
            return value
        if isinstance(value, bytes | bytearray):
            if value[:1] == b"\x80":
                raise AccelerateError(f"{argument} looks like a pickled strategy (ATorch's format): flextrain "
                                      "never unpickles; give the method list or a JSON strategy (Strategy.to_json)")
            try:
                return cls.from_json(bytes(value).decode("utf-8"), argument=argument)
            except UnicodeDecodeError:
                raise AccelerateError(f"{argument}: bytes must be a UTF-8 JSON strategy") from None
        if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
            return cls.from_json(value, argument=argument)
        if isinstance(value, str | os.PathLike):
            path = Path(value)
            try:
                data = path.read_bytes()
            except OSError as e:
                raise AccelerateError(f"{argument}: cannot read strategy file {str(path)!r}: {e.strerror or e}") from None
            return cls.load(data, argument=f"{argument} ({path})")
        if isinstance(value, list | tuple):
            return cls(value, argument=argument)
        raise AccelerateError(f"{argument} must be a list of method names and (name, config) pairs, a Strategy, "
                              f"JSON text or bytes, or a file path; got {type(value).__name__}")


__all__ = ["FORMAT", "Step", "Strategy", "conflict"]
