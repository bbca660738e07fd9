"""What the processes of a bench/rescale run leave behind: step stamp files, log lines, status files."""

from __future__ import annotations

import glob
import json
import re
import statistics
from datetime import datetime
from pathlib import Path


def summary(samples: list[float]) -> dict:
    vals = [round(v, 4) for v in samples if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "samples": []}
    return {"median": round(statistics.median(vals), 4), "min": min(vals), "max": max(vals),
            "n": len(vals), "samples": vals}


def rnd4(v):
    return None if v is None else round(v, 4)


def read_steps(path: Path | str) -> list[tuple[float, int]]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and line.endswith("\n"):
                    out.append((float(parts[0]), int(parts[1])))
    except OSError:
        pass
    return out


def first_after(steps: list[tuple[float, int]], t: float) -> float | None:
    return next((ts for ts, _ in steps if ts > t), None)


def last_before(steps: list[tuple[float, int]], t: float) -> float | None:
    before = [ts for ts, _ in steps if ts < t]
    return before[-1] if before else None


ASCTIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"


def parse_asctime(text: str) -> float:
    """logging's default asctime (local time, ms) -> epoch seconds."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def log_times(path: Path, pattern: str) -> dict[str, float]:
    """``{group(2): asctime}`` for every line matching ``ASCTIME + pattern`` (first occurrence)."""
    rx = re.compile("^" + ASCTIME + pattern)
    found: dict[str, float] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        m = rx.match(line)
        if m and m.group(2) not in found:
            found[m.group(2)] = parse_asctime(m.group(1))
    return found


def read_status(job_dir: Path) -> dict | None:
    try:
        return json.loads((job_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None


def read_procs(tdir: Path) -> list[dict]:
    out = []
    for p in glob.glob(str(tdir / "proc-*.json")):
        try:
            info = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        info["steps"] = read_steps(tdir / f"steps-{info['tag']}-{info['pid']}.txt")
        out.append(info)
    return out
