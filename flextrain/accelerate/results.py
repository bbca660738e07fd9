"""What the automatic search (:mod:`flextrain.accelerate.search`) reports: its candidates and result.

A :class:`Candidate` is one strategy with its dry runs and status (:data:`PICKED`, :data:`ACCEPTED`,
:data:`REJECTED`, :data:`TIME_LIMIT`); a :class:`SearchResult` is every candidate in the order tried
with the pick, as JSON-able rows, a plain-text table or a rich table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TextIO

from flextrain.accelerate.context import Skipped
from flextrain.accelerate.dryrun import DryRunResult
from flextrain.accelerate.strategy import Step, Strategy
from flextrain.elastic.memory import format_bytes

PICKED, ACCEPTED, REJECTED, TIME_LIMIT = "picked", "accepted", "rejected", "time limit"


def describe_step(step: Step) -> str:
    """A short label for one method of a strategy: ``amp_native(bf16)``, ``checkpoint(Block)``."""
    config = step.config
    if config is None:
        return step.name
    if step.name == "amp_native":
        return f"amp_native({config['dtype']})"
    if step.name == "half":
        return f"half({config})"
    if step.name == "checkpoint":
        classes = ",".join(c if isinstance(c, str) else c.__name__ for c in config["wrap_class"])
        return f"checkpoint({classes})"
    if step.name == "parallel_mode":
        return "parallel_mode"
    text = repr(config)
    return f"{step.name}({text if len(text) <= 40 else text[:37] + '...'})"


def describe(strategy: Strategy) -> str:
    """A short label for a strategy: its methods' labels joined by ``+``, or ``plain``."""
    return " + ".join(describe_step(s) for s in strategy) or "plain"


@dataclass(frozen=True)
class Candidate:
    """One strategy the search considered, with its dry runs (none when the time limit left it out).

    ``round``: 0 the plain run and the base, 1 single methods, 2 pairs, 3 triples, ...
    ``samples_per_second`` is the best of its runs; ``seconds`` the wall time its runs took."""

    strategy: Strategy
    round: int
    status: str
    runs: tuple[DryRunResult, ...] = ()
    reason: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status in (ACCEPTED, PICKED)

    @property
    def samples_per_second(self) -> float | None:
        figures = [r.samples_per_second for r in self.runs if r.ok]
        return max(figures) if figures and self.accepted else None

    @property
    def peak_bytes(self) -> int | None:
        peaks = [r.peak_bytes for r in self.runs if r.ok and r.peak_bytes is not None]
        return max(peaks) if peaks and self.accepted else None

    @property
    def seconds(self) -> float:
        return sum(r.wall_seconds or 0.0 for r in self.runs)

    @property
    def run_seconds(self) -> float:
        """What one dry run of it takes: the shortest of its runs (the first may pay one-off costs)."""
        return min((r.wall_seconds or 0.0 for r in self.runs), default=0.0)

    @property
    def best_run(self) -> DryRunResult | None:
        ok = [r for r in self.runs if r.ok]
        return max(ok, key=lambda r: r.samples_per_second) if ok and self.accepted else None

    @property
    def label(self) -> str:
        return describe(self.strategy)


@dataclass(frozen=True)
class SearchResult:
    """What the automatic search did: every candidate in the order tried (the plain run first), the
    pick (None when even the plain run failed), the seconds it took, and whether the time limit
    left candidates out or stopped them (``stopped_early``)."""

    candidates: tuple[Candidate, ...]
    chosen: Candidate | None
    elapsed: float
    time_limit: float
    stopped_early: bool
    steps: int
    skipped: tuple[Skipped, ...] = ()  # included methods that cannot apply here (skip_unavailable)
    notes: tuple[str, ...] = ()  # e.g. finalists the time limit left without their second run

    @property
    def strategy(self) -> Strategy | None:
        return None if self.chosen is None else self.chosen.strategy

    @property
    def plain(self) -> Candidate:
        return self.candidates[0]

    @property
    def tried(self) -> tuple[DryRunResult, ...]:
        """Every dry run, in the order run."""
        return tuple(r for c in self.candidates for r in c.runs)

    def speedup(self, candidate: Candidate) -> float | None:
        """``candidate``'s samples/s over the plain run's (None unless both ran)."""
        a, b = candidate.samples_per_second, self.plain.samples_per_second
        return a / b if a is not None and b else None

    def rows(self) -> list[dict[str, Any]]:
        """The table as JSON-able dicts (for logs, files and benches)."""
        return [{"methods": list(c.strategy.names), "label": c.label, "round": c.round, "status": c.status,
                 "samples_per_second": c.samples_per_second, "vs_plain": self.speedup(c),
                 "peak_bytes": c.peak_bytes, "runs": len(c.runs), "seconds": round(c.seconds, 3),
                 "reason": c.reason} for c in self.candidates]

    def _cells(self, c: Candidate) -> list[str]:
        sps, ratio = c.samples_per_second, self.speedup(c)
        return [c.label, "" if sps is None else f"{sps:,.1f}", "" if ratio is None else f"{ratio:.2f}x",
                "" if c.peak_bytes is None else format_bytes(c.peak_bytes), f"{c.seconds:.2f}", str(len(c.runs)),
                c.status, _short(c.reason or "")]

    _HEADER = ("methods", "samples/s", "vs plain", "peak memory", "dry-run s", "runs", "status", "why")

    def summary(self) -> str:
        picked = self.chosen.label if self.chosen is not None else "nothing (the plain run failed)"
        early = ", stopped early by the time limit" if self.stopped_early else ""
        return (f"auto_accelerate search: {len(self.candidates)} candidates in {self.elapsed:.1f} s "
                f"(time limit {self.time_limit:g} s{early}); picked {picked}")

    def table(self) -> str:
        """The candidates as a plain-text table."""
        rows = [list(self._HEADER)] + [self._cells(c) for c in self.candidates]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEADER) - 1)]
        left = (0, len(self._HEADER) - 2)
        lines = ["  ".join([cell.ljust(w) if i in left else cell.rjust(w) for i, (cell, w) in
                            enumerate(zip(r, widths))] + [r[-1]]).rstrip() for r in rows]
        return "\n".join([self.summary(), *lines, *self.notes])

    def print(self, file: TextIO | None = None) -> None:
        """Print the table: with rich where it is installed, else as plain text."""
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            print(self.table(), file=file or sys.stdout)
            return
        table = Table(title=self.summary(), title_justify="left")
        last = len(self._HEADER) - 1
        for i, name in enumerate(self._HEADER):
            table.add_column(name, justify="left" if i in (0, last - 1, last) else "right", no_wrap=i < last,
                             overflow="fold")
        for c in self.candidates:
            table.add_row(*self._cells(c), style="bold green" if c.status == PICKED else
                          "dim" if c.status in (REJECTED, TIME_LIMIT) else None)
        console = Console(file=file or sys.stdout)
        if not console.is_terminal:  # a log file: wide enough for the reasons
            console.width = max(console.width, 160)
        console.print(table)
        for note in self.notes:
            console.print(note)

    def __str__(self) -> str:
        return self.table()


def _short(reason: str, limit: int = 120) -> str:
    """A reason's first line, cut at ``limit`` characters (rows() and the log keep it whole)."""
    line = reason.split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[:limit - 3] + "..."
