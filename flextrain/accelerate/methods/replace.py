"""``module_replace``: swap known modules for faster equivalents that compute the same outputs.

Replacement pairs are registered by name, as in ATorch (:func:`register_replace_pair`). A pair
``(Source, Target)`` replaces every module whose class is exactly ``Source`` by
``Target.from_module(module, **kwargs)`` (or ``Target(module, **kwargs)``); the target takes over
the source's parameters, so ``state_dict`` keys and weights stay the same. A pair applies only
where the training dtype (fp32, or the dtype of ``half``/``amp_native``) is in its
``supported_dtypes``.

Config: None (every registered pair), a list of pair names, or ATorch's
``{pair_name: kwargs or None}``.

Built in: ``MultiheadAttention_SDPA`` replaces ``torch.nn.MultiheadAttention`` by
:class:`SDPAMultiheadAttention`, which always takes torch's fused
``scaled_dot_product_attention`` path: ``nn.MultiheadAttention`` computes and returns the
averaged attention weights unless called with ``need_weights=False`` (its default is True), which
costs a ``(batch, length, length)`` tensor and the unfused softmax; the replacement returns None
for the weights. Its outputs equal the original's (to float rounding). Do not use it where your
code reads the attention weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from flextrain.accelerate.methods.base import HALF_DTYPES, Method, Phase
from flextrain.accelerate.methods.registry import register

_ALL_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})


class ReplacePair(NamedTuple):
    source: type
    target: type
    kwargs: dict[str, Any]
    supported_dtypes: frozenset


REPLACEMENT_PAIRS: dict[str, ReplacePair] = {}


def register_replace_pair(pair_name: str, kwargs: dict[str, Any] | None = None,
                          supported_dtypes: Any = _ALL_DTYPES, pair_cls: tuple[type, type] | None = None) -> Any:
    """Register ``pair_cls=(Source, Target)`` under ``pair_name`` (ATorch's signature). Without
    ``pair_cls`` it is a class decorator for the target, whose source is its ``_src_module_cls``
    attribute or else its base class."""

    def add(source: type, target: type) -> None:
        for cls in (source, target):
            if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                raise TypeError(f"register_replace_pair({pair_name!r}): {cls!r} is not an nn.Module class")
        REPLACEMENT_PAIRS[pair_name] = ReplacePair(source, target, dict(kwargs or {}), frozenset(supported_dtypes))

    if pair_cls is None:
        def decorator(target: type) -> type:
            add(getattr(target, "_src_module_cls", target.__base__), target)
            return target
        return decorator
    add(*pair_cls)
    return None


def adopt(cls: type, module: torch.nn.Module) -> torch.nn.Module:
    """A ``cls`` instance that is ``module`` in all but class: same attributes, same parameter and
    buffer objects, same submodules (new dicts, so the old module can be dropped)."""
    new = cls.__new__(cls)
    new.__dict__.update(module.__dict__)
    for key in ("_parameters", "_buffers", "_modules"):
        new.__dict__[key] = dict(module.__dict__[key])
    return new


class SDPAMultiheadAttention(torch.nn.MultiheadAttention):
    """``nn.MultiheadAttention`` always on the fused ``scaled_dot_product_attention`` path (module
    docstring); returns ``(output, None)``."""

    _src_module_cls = torch.nn.MultiheadAttention

    @classmethod
    def from_module(cls, module: torch.nn.MultiheadAttention) -> SDPAMultiheadAttention:
        return adopt(cls, module)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=False,
                               attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)


register_replace_pair("MultiheadAttention_SDPA")(SDPAMultiheadAttention)


def _make(pair: ReplacePair, module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.nn.Module:
    make: Callable[..., torch.nn.Module] = getattr(pair.target, "from_module", pair.target)
    return make(module, **kwargs)


def _training_dtype(strategy: Any) -> torch.dtype:
    for name in ("half", "amp_native"):
        config = strategy.config(name)
        if config is not None:
            return HALF_DTYPES[config if isinstance(config, str) else config["dtype"]]
    return torch.float32


@register
class ModuleReplace(Method):
    name, phase = "module_replace", Phase.REPLACE
    summary = "swap known modules for faster equivalents (nn.MultiheadAttention -> SDPA; your registered pairs)"

    def validate(self, config: Any) -> Any:
        if config is None:
            return None
        if isinstance(config, list | tuple):
            config = dict.fromkeys(config)
        cfg = self.dict_config(config)
        cfg.pop("verbose", None)  # ATorch's logging switch
        unknown = [n for n in cfg if n not in REPLACEMENT_PAIRS]
        if unknown:
            raise self.config_error(config, f"names unregistered pair {unknown[0]!r} (registered: "
                                            f"{', '.join(sorted(REPLACEMENT_PAIRS))})")
        for name, kwargs in cfg.items():
            if kwargs is not None and not isinstance(kwargs, dict):
                raise self.config_error(config, f"has kwargs for {name!r} that are not a dict")
        return cfg or None

    def _pairs(self, config: Any) -> dict[str, dict[str, Any]]:
        names = REPLACEMENT_PAIRS if config is None else config
        return {n: {**REPLACEMENT_PAIRS[n].kwargs, **((config or {}).get(n) or {})} for n in names}

    def check(self, model: torch.nn.Module, device: torch.device, world: Any, config: Any = None) -> str | None:
        sources = {REPLACEMENT_PAIRS[n].source for n in self._pairs(config)}
        if not any(type(m) in sources for m in model.modules()):
            return "the model has no module that a registered replacement pair replaces"
        return None

    def apply(self, ctx: Any, config: Any) -> None:
        dtype = _training_dtype(ctx.strategy)
        replaced: dict[str, int] = {}
        for name, kwargs in self._pairs(config).items():
            pair = REPLACEMENT_PAIRS[name]
            if dtype not in pair.supported_dtypes:
                ctx.note(f"module_replace: {name} skipped, it does not support {dtype}")
                continue
            if type(ctx.model) is pair.source:
                ctx.model = ctx.core = _make(pair, ctx.model, kwargs)
                replaced[name] = replaced.get(name, 0) + 1
            for parent in list(ctx.model.modules()):
                for child_name, child in list(parent.named_children()):
                    if type(child) is pair.source:
                        setattr(parent, child_name, _make(pair, child, kwargs))
                        replaced[name] = replaced.get(name, 0) + 1
        done = ", ".join(f"{n} x{k}" for n, k in replaced.items()) or "nothing"
        ctx.note(f"module_replace: replaced {done}")


__all__ = ["REPLACEMENT_PAIRS", "ModuleReplace", "ReplacePair", "SDPAMultiheadAttention", "adopt",
           "register_replace_pair"]
