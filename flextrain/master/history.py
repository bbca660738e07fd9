"""The job's recorded history: ``<job-dir>/events.jsonl``, one compact JSON object a line.

Contract (the record schema is in docs/observability.md, "Job history"):

* The master appends; it never rewrites. A restarted master (``--resume``, a
  relaunched master pod) appends a ``start`` record and goes on; what the file
  already holds is not recorded again (evaluations by step). A torn last line
  (a master killed mid-write) is ended before the first new record, and
  :func:`read_events` skips lines that do not parse.
* Writing is cheap: every line is flushed to the OS, never fsync'd; a
  ``metrics`` line every :data:`METRICS_INTERVAL` seconds while the job runs,
  plus one per event (a round, a join or leave, a failure, a relaunch, an
  evaluation, a scale, a phase).
* :class:`HistoryRecorder` is a sink of :class:`flextrain.master.status.StatusReporter`:
  it is called with every status snapshot (once a second) and derives the
  records from the snapshots and from the job's failures, launches and changes
  of the desired count (each timed when it happened, not at the snapshot). Each
  new record also goes to its ``listeners`` (the TensorBoard writer).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Callable, Iterable

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
METRICS_INTERVAL = 2.0  # seconds between `metrics` records while training
OVER = ("Succeeded", "Failed")


def read_events(path: str | Path) -> list[dict]:
    """The records of an events.jsonl (a file or a job directory), oldest first; lines that do not
    parse (a torn last line) are skipped. FileNotFoundError when there is none."""
    path = Path(path)
    if path.is_dir():
        path = path / EVENTS_FILE
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("type"), str) and isinstance(rec.get("time"), (int, float)):
                records.append(rec)
    return records


def _number(value) -> float | None:
    """A metric as a record holds it: a finite float, else None (status.json writes NaN as "nan")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _why(failure) -> str:
    """A failure's short cause for a ``leave``/``failure`` record: killed, hang, failed, ..."""
    kind = failure.kind.value
    if kind == "Infrastructure":
        return "killed"
    if kind == "Hang":
        return "hang"
    return "failed"


class HistoryRecorder:
    """Appends the job's history to ``path`` from status snapshots (see the module docstring).

    ``job`` is the :class:`~flextrain.master.coordinator.JobMaster` (its failures, launches and
    departures are read under its lock); ``resume``: this master continues a recorded job.
    """

    def __init__(self, job, *, path: Path, resume: bool, listeners: Iterable[Callable[[dict], None]] = (),
                 interval: float = METRICS_INTERVAL, clock: Callable[[], float] = time.time) -> None:
        self.job, self.path, self.interval, self.clock = job, Path(path), interval, clock
        self.listeners = tuple(listeners)
        recorded = read_events(self.path) if self.path.exists() else []
        self._evaluated = {r["step"] for r in recorded if r["type"] == "evaluation"}
        self._phase: str | None = None
        self._scales = 0  # of job.scales, recorded so far
        self._round: int | None = None  # the last round recorded (round ids restart with each master)
        self._members: list[str] = []
        self._failures = 0  # of job.failures.history, recorded so far
        self._launched: set[str] = set()
        self._replacing: list[str] = []  # failed workers a launch replaces next (a relaunch)
        self._last_metrics = -math.inf
        self._final_metrics = False  # the job's last metrics recorded (once it is over)
        self._held = False  # a metrics record waited for a loss (_loss_pending): the job ran
        self._whys: dict[str, str] = {}  # failed workers: why they left
        self._file = self._open()
        self.write({"type": "start", "resume": resume, "pid": os.getpid()})

    def _open(self):
        f = open(self.path, "a+b", buffering=0)
        if f.tell() > 0:  # a torn last line (a master killed mid-write) would swallow the next record
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")
        return f

    def write(self, record: dict) -> None:
        """Append ``record`` (``type`` first, ``time`` added) and hand it to the listeners."""
        record = {"type": record["type"], "time": round(record.get("time") or self.clock(), 3),
                  **{k: v for k, v in record.items() if k not in ("type", "time")}}
        try:
            self._file.write((json.dumps(record, separators=(",", ":")) + "\n").encode())
        except (OSError, ValueError) as exc:  # a full disk: the history has a gap, the job goes on
            log.warning("cannot append to %s: %s", self.path, exc)
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:  # noqa: BLE001 - a listener (TensorBoard) must not stop the job
                log.exception("history listener %r failed", listener)

    # ---- a status snapshot ------------------------------------------------------------
    def __call__(self, snap: dict) -> None:
        now = self.clock()
        departed = self._failures_and_launches()
        for rnd in snap.get("roundHistory", []):
            if self._round is None or rnd["round"] > self._round:
                self._record_round(rnd, departed)
        for entry in snap.get("evaluations", []):
            if entry["step"] not in self._evaluated:
                self._evaluated.add(entry["step"])
                self.write({"type": "evaluation", "time": entry.get("time"), "step": entry["step"],
                            "samples": entry.get("samples", 0),
                            "metrics": {k: _number(v) for k, v in entry["metrics"].items()}})
        due = snap["phase"] == "Running" and now - self._last_metrics >= self.interval
        if due and self._loss_pending(snap):
            due, self._held = False, True
        last = snap["phase"] in OVER and (self._last_metrics > -math.inf or self._held) and not self._final_metrics
        if due or last:
            self._last_metrics, self._final_metrics = now, last
            self._metrics(snap)
        # Last: the rounds, joins and evaluations above happened before the snapshot saw this phase (a
        # job's end came after its last round), and the file is read in order
        if snap["phase"] != self._phase:
            self._phase = snap["phase"]
            self.write({"type": "phase", "phase": snap["phase"], "message": snap.get("message", "")})

    def _loss_pending(self, snap: dict) -> bool:
        """Whether a trained step's loss is still on its way: a module's workers report it with the
        heartbeat after their steps, which may come after the steps are known (a task call, a resumed
        master's checkpoint). The record waits for it; a script may never report a loss."""
        return snap["step"] > 0 and "loss" not in snap["metrics"] and not self.job.spec.is_script

    def _metrics(self, snap: dict) -> None:
        self.write({"type": "metrics", "step": snap["step"], "loss": _number(snap["metrics"].get("loss")),
                    "lr": _number(snap.get("learningRate")), "lrFactor": _number(snap.get("lrFactor")),
                    "globalBatch": snap.get("globalBatchSize"), "samplesPerSecond": snap["samplesPerSecond"],
                    "workers": snap["workers"]["active"], "desired": snap["workers"]["desired"],
                    "recordsDone": snap["progress"]["recordsDone"]})

    def _failures_and_launches(self) -> dict[str, str]:
        """Record new scales, failures and launches (a launch after a failure is its relaunch); returns why
        each worker that left so far left."""
        job = self.job
        with job.cond:
            failures = list(job.failures.history[self._failures:])
            self._failures += len(failures)
            launches = sorted(((t, w) for w, t in job.launched_at.items() if w not in self._launched))
            scales = job.scales[self._scales:]
            self._scales += len(scales)
            departed = dict(job.departed)
            offset = time.time() - job.clock()  # launch and scale times are the job's clock's (monotonic)
        records = []
        for failure in failures:
            records.append({"type": "failure", "time": failure.time, "worker": failure.worker_id,
                            "why": _why(failure), "kind": failure.kind.value, "detail": failure.summary()[:300]})
            self._replacing.append(failure.worker_id)
        for t, worker in launches:
            self._launched.add(worker)
            if self._replacing:
                records.append({"type": "relaunch", "time": t + offset, "worker": worker,
                                "replaces": self._replacing.pop(0)})
            elif self._round is not None:  # launches before the first round are the job's start
                records.append({"type": "launch", "time": t + offset, "worker": worker})
        # Each scale goes before the first record later than it (the launches it caused): the failures and
        # launches keep their order, which pairs a relaunch with its failure.
        pending = [{"type": "scale", "time": t + offset, "desired": desired, "previous": previous}
                   for t, previous, desired in scales]
        for record in records:
            while pending and pending[0]["time"] <= record["time"]:
                self.write(pending.pop(0))
            self.write(record)
        for record in pending:
            self.write(record)
        for failure in failures:
            self._whys[failure.worker_id] = _why(failure)
        return {**departed, **self._whys}

    def _record_round(self, rnd: dict, departed: dict[str, str]) -> None:
        members = [m["id"] for m in rnd["members"]]
        first = self._round is None
        self._round = rnd["round"]
        self.write({"type": "round", "time": rnd["time"], "round": rnd["round"], "version": rnd["version"],
                    "members": members})
        for worker in members:
            if worker not in self._members:
                self.write({"type": "join", "time": rnd["time"], "worker": worker, "round": rnd["round"],
                            "why": "start" if first else "joined"})
        for worker in self._members:
            if worker not in members:
                self.write({"type": "leave", "time": rnd["time"], "worker": worker, "round": rnd["round"],
                            "why": departed.get(worker, "left")})
        self._members = members

    def close(self) -> None:
        self._file.close()
        for listener in self.listeners:
            close = getattr(listener, "close", None)
            if close is not None:
                close()





def job_history(job, *, resume: bool) -> HistoryRecorder:
    """The recorder of ``job``'s history in its directory, with TensorBoard files unless the spec
    turns them off (``training.tensorboard``)."""
    listeners = []
    if job.spec.training.tensorboard:
        from flextrain.master.tensorboard import TensorBoardWriter

        listeners.append(TensorBoardWriter(job.spec.job_dir))
    return HistoryRecorder(job, path=Path(job.spec.job_dir) / EVENTS_FILE, resume=resume, listeners=listeners)
__all__ = ["EVENTS_FILE", "METRICS_INTERVAL", "HistoryRecorder", "job_history", "read_events"]
