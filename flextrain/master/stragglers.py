"""Slow workers: stragglers found from their step times, slow nodes kept out by a pre-flight check.

In a lockstep round every member's step takes as long as the slowest member's, so the step time
says nothing about who is slow. What differs is the *compute* a worker spends per sample (reading,
forward, loss, backward, outside any wait for its peers): workers send it with their heartbeats
(``compute_seconds`` over ``compute_samples`` since the previous one; flextrain/worker/state.py).

Contract of :class:`StragglerTracker`:

* A worker's figure is a moving average of its per-heartbeat seconds per sample; it counts once
  ``min_reports`` of its heartbeats carried measured steps.
* It is compared with the median of the *other* measured workers'. A worker above ``factor`` × that
  median for ``patience`` heartbeats in a row is a straggler; :meth:`observe` returns it once (a
  :class:`Straggler`), then it stays flagged (:meth:`flagged`) until it recovers for ``patience``
  heartbeats or leaves (:meth:`forget`).
* :meth:`admit` judges a pre-flight node check (``--node-check``): the seconds per sample of the
  worker's own training step measured before it registers. A worker ``factor`` × slower than the
  median of the checks admitted so far is refused (it never joins a round); the first one sets the
  reference.

What the master does with a straggler is the job's ``--straggler-policy``
(:class:`StragglerPolicy`); the tracker only finds them.
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass, field

from flextrain.job import Strategy

PATIENCE = 3  # heartbeats in a row above the factor before a worker is a straggler
MIN_REPORTS = 3  # heartbeats with measured steps before a worker's figure counts
WEIGHT = 0.5  # of the newest heartbeat in the moving average


class StragglerPolicy(str, enum.Enum):
    """``--straggler-policy``: what the master does with a straggler."""

    OFF = "off"  # not tracked
    REPORT = "report"  # status, log and (Kubernetes) an Event
    REPLACE = "replace"  # ... and released and replaced (PS mode: its tasks shrink instead)


@dataclass(frozen=True)
class Straggler:
    """A worker found persistently slower than the others."""

    worker_id: str
    ratio: float  # its seconds per sample over the median of the others'
    seconds_per_sample: float
    median: float
    node: str = ""  # where it runs ("" unknown)

    def describe(self, factor: float) -> str:
        where = f" on node {self.node}" if self.node else ""
        return (f"{self.worker_id}{where} is a straggler: {self.ratio:.1f}x the other workers' median compute "
                f"time per sample ({self.seconds_per_sample * 1e3:.3g} ms vs {self.median * 1e3:.3g} ms; "
                f"--straggler-factor {factor:g})")


@dataclass
class _Figure:
    per_sample: float = 0.0
    reports: int = 0
    above: int = 0  # consecutive heartbeats above the factor
    below: int = 0  # ... and, once flagged, below it
    flagged: bool = False
    node: str = ""


@dataclass
class StragglerTracker:
    """Finds stragglers and judges node checks (module docstring); not thread-safe (the caller holds
    the master's lock)."""

    factor: float = 2.0
    patience: int = PATIENCE
    min_reports: int = MIN_REPORTS
    figures: dict[str, _Figure] = field(default_factory=dict)
    checks: dict[str, float] = field(default_factory=dict)  # admitted node checks: seconds per sample
    links: dict[str, float] = field(default_factory=dict)  # ... and their link probes: seconds per MiB

    def observe(self, worker_id: str, *, seconds: float, samples: int, node: str = "") -> Straggler | None:
        """A heartbeat's compute figure; returns the worker when this heartbeat makes it a straggler."""
        if samples <= 0 or seconds < 0:
            return None
        fig = self.figures.setdefault(worker_id, _Figure())
        fig.node = node or fig.node
        now = seconds / samples
        fig.per_sample = now if not fig.reports else WEIGHT * now + (1 - WEIGHT) * fig.per_sample
        fig.reports += 1
        if fig.reports < self.min_reports:
            return None
        median = self._median_of_others(worker_id)
        if median is None:
            return None
        ratio = fig.per_sample / median if median > 0 else 1.0
        if ratio > self.factor:
            fig.above, fig.below = fig.above + 1, 0
            if not fig.flagged and fig.above >= self.patience:
                fig.flagged = True
                return Straggler(worker_id, ratio, fig.per_sample, median, fig.node)
        else:
            fig.above, fig.below = 0, fig.below + 1
            if fig.flagged and fig.below >= self.patience:
                fig.flagged = False
        return None

    def flagged(self, worker_id: str) -> float | None:
        """The ratio of a flagged straggler (its seconds per sample over the others' median); None: not one."""
        fig = self.figures.get(worker_id)
        if fig is None or not fig.flagged:
            return None
        median = self._median_of_others(worker_id)
        return fig.per_sample / median if median else None

    def _median_of_others(self, worker_id: str) -> float | None:
        """The median figure of the other measured workers; None: none measured yet."""
        others = [f.per_sample for w, f in self.figures.items() if w != worker_id and f.reports >= self.min_reports]
        return statistics.median(others) if others else None

    def forget(self, worker_id: str) -> None:
        """The worker left: its figures no longer take part in anyone's median."""
        self.figures.pop(worker_id, None)
        self.checks.pop(worker_id, None)
        self.links.pop(worker_id, None)

    def admit(self, worker_id: str, seconds_per_sample: float, link: float = 0.0) -> str:
        """Judge a node check (``link``: its all-reduce probe in seconds per MiB, 0 none); "" admits the
        worker, otherwise why it is refused."""
        for figure, book, what, unit in ((seconds_per_sample, self.checks, "training step", "per sample"),
                                         (link, self.links, "all-reduce with the master", "per MiB")):
            if figure > 0 and book and (median := statistics.median(book.values())) > 0 \
                    and figure > self.factor * median:
                return (f"its node check measured {figure * 1e3:.3g} ms of {what} {unit}, {figure / median:.1f}x "
                        f"the median {median * 1e3:.3g} ms of the job's other workers (--node-check, "
                        f"--straggler-factor {self.factor:g})")
        if seconds_per_sample > 0:
            self.checks[worker_id] = seconds_per_sample
        if link > 0:
            self.links[worker_id] = link
        return ""

    def node_checks(self) -> dict[str, dict]:
        """For status.json: the admitted workers' node checks (ms per sample; ms per MiB all-reduced)."""
        return {w: {"msPerSample": round(s * 1e3, 4),
                    **({"linkMsPerMiB": round(self.links[w] * 1e3, 4)} if w in self.links else {})}
                for w, s in sorted(self.checks.items())}

    def snapshot(self) -> dict[str, dict]:
        """For status.json: each measured worker's figure and whether it is a straggler."""
        return {w: {"compute_ms_per_sample": round(f.per_sample * 1e3, 4), "straggler": f.flagged,
                    **({"node": f.node} if f.node else {})}
                for w, f in sorted(self.figures.items()) if f.reports >= self.min_reports}


# ---- what the master does with what the tracker finds (callers hold the job's lock) ---------------
@dataclass(frozen=True)
class SlowWorker:
    """A straggler found or a node check refused: what the master's main loop acts on."""

    worker_id: str
    message: str
    node: str = ""
    replace: bool = False  # release it and launch a replacement (elsewhere on Kubernetes)


def note_compute(job, worker_id: str, *, seconds: float, samples: int) -> None:
    """A heartbeat's compute figure: a straggler it reveals is noted and queued for the main loop."""
    policy = StragglerPolicy(job.spec.worker.straggler_policy)
    if policy is StragglerPolicy.OFF:
        return
    info = job.workers.get(worker_id)
    found = job.stragglers.observe(worker_id, seconds=seconds, samples=samples, node=info.node if info else "")
    if found is None:
        return
    message = found.describe(job.spec.worker.straggler_factor)
    replace = False
    if policy is StragglerPolicy.REPLACE and job.spec.strategy is Strategy.PARAMETER_SERVER:
        message += "; its tasks shrink accordingly (ParameterServer)"
    elif policy is StragglerPolicy.REPLACE and job.replacements_left() > 0:
        replace = True
        message += "; replacing it" + (f" on another node than {found.node}" if found.node else "")
    elif policy is StragglerPolicy.REPLACE:
        message += "; not replaced: as many slow workers were replaced as the relaunch budget allows"
    job.note(message)
    job.slow_workers.append(SlowWorker(worker_id, message, found.node, replace))


def judge_node_check(job, worker_id: str, check, *, node: str) -> str:
    """A registering worker's node check (``pb.NodeCheck`` or None): "" admits it, else why it is refused
    (noted, queued for replacement)."""
    if check is None:
        return ""
    why = job.stragglers.admit(worker_id, check.seconds_per_sample, check.link_seconds_per_mib)
    if not why:
        return ""
    where = f" on node {node}" if node else ""
    if job.replacements_left() <= 0:
        job.stragglers.checks[worker_id] = check.seconds_per_sample
        if check.link_seconds_per_mib > 0:
            job.stragglers.links[worker_id] = check.link_seconds_per_mib
        job.note(f"{worker_id}{where} admitted although {why}: as many slow workers were replaced as the "
                 "relaunch budget allows")
        return ""
    message = f"{worker_id}{where} kept out of the job: {why}; replacing it"
    job.note(message)
    job.slow_workers.append(SlowWorker(worker_id, message, node, replace=True))
    return message


def shrink(job, worker_id: str, size: int) -> int:
    """ParameterServer with --straggler-policy replace: a flagged straggler's task size (records), cut by
    its ratio to the others' median so that its tasks take about as long as theirs."""
    if job.spec.worker.straggler_policy != StragglerPolicy.REPLACE.value:
        return size
    ratio = job.stragglers.flagged(worker_id)
    return size if ratio is None else max(1, int(size / ratio))
