"""Memory sizes without torch: :func:`parse_memory` ("4GiB", "512MB", 2**30 to bytes),
:func:`format_bytes` and :func:`default_memory_limit` (a fraction of the container's memory).

Apart from :mod:`flextrain.elastic.memory` (which re-exports them) so that the master and the CLI,
which check and print sizes, run without importing torch."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

# Bare K/M/G/T are binary, as Docker and most tools that print memory read them (Kubernetes
# reads "2G" as 10**9: write 2GB or 2Gi to leave no doubt).
_UNITS = {"": 1, "b": 1, **{p + "b": 1000**i for i, p in enumerate("kmgt", 1)},
          **{p + suffix: 1024**i for i, p in enumerate("kmgt", 1) for suffix in ("", "i", "ib")}}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_ACCEPTED = ("give bytes (an int) or a number with a unit, e.g. '4GiB', '512MB' or '1.5G' "
             "(kB/MB/GB/TB are powers of 1000; KiB/MiB/GiB/TiB and bare K/M/G/T powers of 1024)")


def parse_memory(value: Any, *, what: str = "memory_limit") -> int | None:
    """Bytes from a memory size: None, a positive int (bytes), or a string like "512MB", "1.5GiB",
    "2G", "300 MiB", "1024". Units are case-insensitive; kB/MB/GB/TB are decimal, KiB/MiB/GiB/TiB
    (and Ki/Mi/Gi/Ti, and bare K/M/G/T) binary. A fraction of a byte is rounded down. Anything
    else (zero, negative, NaN, a bool, an unknown unit) raises ValueError naming ``what``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{what}={value!r} is not a memory size: {_ACCEPTED}")
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"{what}={value!r} is not a memory size: {_ACCEPTED}")
        amount = Fraction(match.group(1)) * _UNITS[match.group(2).lower()]
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what}={value!r} is not a memory size: {_ACCEPTED}")
    else:
        amount = Fraction(value)
    if amount <= 0:
        raise ValueError(f"{what}={value!r} must be more than zero bytes, e.g. '4GiB'")
    if amount < 1:
        raise ValueError(f"{what}={value!r} is less than one byte: {_ACCEPTED}")
    return math.floor(amount)


def format_bytes(n: int) -> str:
    """``n`` bytes for people, in binary units: "512 B", "1.5 MiB"."""
    sign, size = ("-" if n < 0 else ""), float(abs(n))
    if size < 1024:
        return f"{sign}{int(size)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if round(size, 1) < 1024:
            break
    return f"{sign}{size:.1f} {unit}"


# The value cgroup v1 reports for "no limit" (the page counter's maximum): about 2**63.
_V1_UNLIMITED = 2**60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2): no limit


def _meminfo(root: Path) -> dict[str, int]:
    try:
        lines = (root / "proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    info = {}
    for line in lines:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            info[name.strip()] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return info


def default_memory_limit(*, fraction: float = 0.8, root: Path = Path("/")) -> int:
    """``fraction`` of the memory this process may use: the container's cgroup limit (v2
    ``memory.max``, else v1 ``memory.limit_in_bytes``) where one binds, else MemAvailable from
    /proc/meminfo. A cgroup limit binds unless it is "max", cgroup v1's "unlimited" value, or not
    below the machine's MemTotal. ``root`` stands for "/" (tests give a fake tree). Raises
    RuntimeError when neither can be read (not Linux): then give a limit yourself."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    root = Path(root)
    info = _meminfo(root)
    total = info.get("MemTotal")
    for path in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        limit = _read_int(root / path)
        if limit is not None and 0 < limit < _V1_UNLIMITED and (total is None or limit < total):
            return int(limit * fraction)
    if "MemAvailable" not in info:
        raise RuntimeError(f"cannot tell how much memory this process may use (no cgroup limit and no "
                           f"MemAvailable in {root / 'proc/meminfo'}): give a limit, e.g. memory_limit='8GiB'")
    return int(info["MemAvailable"] * fraction)


__all__ = ["default_memory_limit", "format_bytes", "parse_memory"]
