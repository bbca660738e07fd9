"""Job status: ``status.json`` in the job directory and the terminal progress bar.

The status file has the fields of the ElasticJob status (DESIGN.md, "Job
directory and status"); it is rewritten atomically (temp file + rename), so
``flextrain status`` never reads half a file.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from flextrain.job import JobType, Strategy
from flextrain.master.batches import step_settings
from flextrain.master.checkpoints import StateWriteError, write_json_atomic
from flextrain.master.evaluation import describe, inference_progress
from flextrain.master.phase import Phase
from flextrain.master.rendezvous import RoundState
from flextrain.proto import flextrain_pb2 as pb

if TYPE_CHECKING:  # the CLI reads status files through this module: no coordinator (and no torch) to import
    from flextrain.master.coordinator import JobMaster


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# ---- views of the job's state (call with job.cond held) ---------------------
def records_done(job: JobMaster) -> int:
    """Training records applied: finished tasks plus the active round's progress (a script job: the
    samples its scripts reported, flextrain.elastic.progress)."""
    if job.spec.is_script:
        return sum(w.samples for w in job.workers.values())
    done = job.ledger.records_done
    rnd = job.rendezvous.current
    if rnd is None or rnd.state is RoundState.CLOSED:  # its tasks not settled (yet, or ever: a failed job)
        return max(done, job.recorded_records)
    best = max(
        (job.workers[m].position for m in rnd.members if m in job.workers
         and job.workers[m].position.round_id == rnd.round_id),
        key=lambda p: p.version, default=None,
    )
    if best is not None and best.task_index < len(rnd.answers):
        action, task_id = rnd.answers[best.task_index]
        task = job.ledger.doing.get(task_id)
        if action == pb.GetTaskResponse.RUN and task is not None:
            done += task.records_in_steps(best.steps_done)
    return done

def members(job: JobMaster) -> list[dict]:
    """The active round's members in rank order, with their process ids."""
    rnd = job.rendezvous.current
    if rnd is None or rnd.state is RoundState.CLOSED or job.over:
        return []
    return [{"id": m, "rank": r, "pid": job.workers[m].pid if m in job.workers else 0,
             "round": rnd.round_id, **({"memory": sample} if (sample := job.memory.of(m)) else {})}
            for r, m in enumerate(rnd.members)]

def traffic(t: pb.PSTraffic) -> dict:
    """The workers' parameter-server calls, summed: count, seconds and bytes of pushes and pulls."""
    return {"pushes": t.pushes, "pushSeconds": round(t.push_seconds, 4), "pushBytes": t.push_bytes,
            "pulls": t.pulls, "pullSeconds": round(t.pull_seconds, 4), "pullBytes": t.pull_bytes}


def active_workers(job: JobMaster) -> int:
    """Workers training now: the live members of the current round (AllReduce, script jobs); with parameter
    servers, which form no rounds, every live registered worker (each takes tasks on its own)."""
    if job.over:
        return 0
    if job.spec.strategy is Strategy.PARAMETER_SERVER:
        return len(job.alive)
    rnd = job.rendezvous.current
    if rnd is None or rnd.state is RoundState.CLOSED:
        return 0
    return sum(1 for m in rnd.members if m in job.alive)

def training_loss(job: JobMaster) -> float:
    """Mean of the live workers' latest reported losses (else the last one seen)."""
    losses = [w.loss for w in job.workers.values() if w.worker_id in job.alive and w.loss is not None]
    return sum(losses) / len(losses) if losses else job.last_loss


def metric_text(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.4f}"


def shown(value: float) -> float | str:
    """A metric as status.json and the ElasticJob hold it: non-finite values as "nan", "inf" or "-inf"
    (strict JSON has no NaN; dropping the metric would hide that it went wrong)."""
    return value if math.isfinite(value) else str(float(value))


# What `flextrain status` reads from status.json, by field: a file without them is refused naming one.
_STATUS_FIELDS = {"name": str, "phase": str, "jobDir": str, "epoch": int, "epochs": int, "step": int, "metrics": dict,
                  "workers": {"active": int, "desired": int},
                  "progress": {"recordsDone": int, "recordsTotal": int, "percent": (int, float)}}


def check_status(data, path: Path) -> dict:
    """``data`` read from ``path`` if it has the fields and types the status commands use; else
    ValueError naming the file and the first field that is wrong."""
    def check(value, want, where: str) -> None:
        if isinstance(want, dict):
            if not isinstance(value, dict):
                raise ValueError(f"{path}: {'field ' + where if where else 'the file'} holds a "
                                 f"{type(value).__name__}, not an object: "
                                 "the file is damaged or not a flextrain status")
            for key, inner in want.items():
                if key not in value:
                    raise ValueError(f"{path}: field {where + '.' if where else ''}{key} is missing: "
                                     "the file is damaged or not a flextrain status")
                check(value[key], inner, f"{where + '.' if where else ''}{key}")
        elif isinstance(value, bool) or not isinstance(value, want):
            names = " or ".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
            raise ValueError(f"{path}: field {where} is {value!r}, not {names}: the file is damaged")

    check(data, _STATUS_FIELDS, "")
    return data


RESERVE_NAME = ".status-reserve"
RESERVE_BYTES = 256 * 1024  # room for a final status.json (tens of kB) once the disk is full


def _reserve(path: Path) -> None:
    """Set aside space for the last status.json: on a full disk a new file cannot be made, and
    the job's end must still reach its status (not a stale "Running"). Best effort."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except (OSError, AttributeError):  # no space even for this, or no fallocate: nothing is reserved
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


class StatusReporter:
    def __init__(self, job: JobMaster, *, path: Path, desired: callable, master_address: str,
                 show_progress: bool, console: Console | None = None, sinks: tuple = (),
                 spares: Callable[[], dict] | None = None,
                 membership: Callable[[int, int], dict] | None = None, metrics_url: str = "") -> None:
        self.job = job
        self.metrics_url = metrics_url
        # (active, desired) -> pending/preempted workers and why fewer are active (k8s_priority.membership)
        self._membership = membership
        self._spares = spares  # --spare-workers: the pool's snapshot (spares are not workers)
        self.path = path
        self._reserve = path.with_name(RESERVE_NAME)
        _reserve(self._reserve)
        # Other destinations of every snapshot (e.g. the ElasticJob's status); each must
        # return quickly and never raise.
        self.sinks = tuple(sinks)
        self._desired = desired
        self.master_address = master_address
        self._rate_window: deque[tuple[float, int]] = deque(maxlen=40)
        self.console = console or Console(stderr=True)
        self._progress = None
        self._bar = None
        self._evaluations_shown: set[int] = set()  # steps whose evaluation was printed
        self._events_shown = 0  # job.events printed so far (failures, kills, rollbacks, ...)
        self._workers_shown = 0  # the bar's worker count: the last one seen while the job ran
        if show_progress:
            self._progress = Progress(
                TextColumn("[bold]{task.fields[epoch]}"), BarColumn(),
                TextColumn("{task.completed:,}/{task.total:,} records"),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} samples/s"),
                TextColumn("workers {task.fields[workers]}"), TimeElapsedColumn(),
                console=self.console, transient=False,
            )
            self._progress.start()
            self._bar = self._progress.add_task(
                "train", total=job.ledger.records_total, epoch="", loss="-", rate="-", workers=0
            )

    def _workers(self) -> dict:
        desired, active = self._desired(), active_workers(self.job)
        return {"desired": desired, "active": active, **(self._membership(active, desired) if self._membership else {})}

    def snapshot(self) -> dict:
        job = self.job
        with job.cond:
            if job.spec.job_type is JobType.TRAINING:
                done, total = records_done(job), job.ledger.records_total
            else:  # evaluation-only / prediction job: records evaluated or predicted
                done, total = inference_progress(job)
            loss = training_loss(job)
            metrics = {"loss": loss} if loss is not None else {}
            metrics.update(job.metrics)
            metrics = {name: shown(value) for name, value in metrics.items()}
            now = time.monotonic()
            self._rate_window.append((now, done))
            t0, d0 = self._rate_window[0]
            rate = (done - d0) / (now - t0) if now > t0 else 0.0
            per_epoch = job.ledger.records_per_epoch
            return {
                "name": job.spec.name,
                "phase": job.phase.value,
                "message": job.message,
                "workers": self._workers(),
                "members": members(job),
                # --spare-workers: spares parked (ready to be taken) and starting; never in workers/members
                **({"spares": self._spares()} if self._spares else {}),
                "epoch": min(job.spec.training.epochs, done // per_epoch + 1) if per_epoch else 0,
                "epochs": job.spec.training.epochs,
                # a script job: the step its scripts reported, else the commits they made
                "step": job.script_step or job.step if job.spec.is_script else job.step,
                # the step in progress: its global batch (a batch schedule's), LR rule and factor (and LR)
                **(step_settings(job.spec, job.ledger.schedule, job.step, adascale=job.adascale)
                   if job.spec.job_type is JobType.TRAINING and not job.spec.is_script else {}),
                # M the current round plans with, and how it was chosen (--max-micro-batch auto: the probes)
                **(job.micro_batches.status() if job.spec.job_type is JobType.TRAINING and not job.spec.is_script
                   else {}),
                # --accelerate: the training strategy the workers apply, and how it was chosen
                **({"accelerate": job.accelerating.status()} if job.spec.training.accelerate else {}),
                # the highest memory peak a worker reported (sampled per heartbeat: elastic.memory.MemoryMonitor)
                "memoryPeak": job.memory.peak,
                # each worker's compute per sample and whether it is a straggler (master/stragglers.py)
                **({"computePerSample": figures} if (figures := job.stragglers.snapshot()) else {}),
                **({"nodeChecks": checks} if (checks := job.stragglers.node_checks()) else {}),
                "tasks": {"todo": len(job.ledger.todo), "doing": len(job.ledger.doing), "done": job.ledger.tasks_done},
                "relaunches": dict(job.relaunch_causes),
                "unauthenticatedCalls": job.unauthenticated_calls,
                **({"psTraffic": traffic(job.ps_traffic)} if job.ps_traffic.pushes or job.ps_traffic.pulls else {}),
                "progress": {
                    "recordsDone": done, "recordsTotal": total,
                    "percent": round(100.0 * done / total, 1) if total else 0.0,
                },
                "metrics": metrics,
                # a prediction job's output, and once it succeeded the predictions written (checked: one per record)
                **({"prediction": {"output": job.spec.output,
                                   "records": done if job.phase is Phase.SUCCEEDED else None}}
                   if job.spec.job_type is JobType.PREDICTION else {}),
                # every finished evaluation, oldest first: {step, metrics, samples, time}
                "evaluations": [{**e, "metrics": {k: shown(v) for k, v in e["metrics"].items()}}
                                for e in job.evaluations.history[-100:]],
                "samplesPerSecond": round(rate, 1),
                "rounds": job.rounds_formed,
                # training-task GetTask calls by worker (AllReduce: a round's rank 0 asks for the round)
                "taskAsks": dict(job.task_asks),
                "roundHistory": job.round_history[-50:],
                "events": job.events[-20:],
                # the job's root cause when a worker's failure ended it (master/failures.py)
                "failure": job.failure.to_status() if job.failure else None,
                "skippedSteps": job.skipped_steps,
                "startTime": iso(job.started),
                "completionTime": iso(job.finished),
                "masterAddress": self.master_address,
                "tls": job.spec.tls,  # --tls: flextrain commands dial the master with <jobDir>/tls/
                # the master's Prometheus endpoint ("" when --no-metrics, and once the job is over: the
                # master serving it is about to exit; flextrain/master/metrics.py)
                "metricsUrl": "" if job.over else self.metrics_url,
                "jobDir": str(Path(job.spec.job_dir).resolve()),
                "pid": os.getpid(),
            }

    def update(self) -> dict:
        snap = self.snapshot()
        try:
            write_json_atomic(self.path, snap)
        except StateWriteError as exc:  # e.g. a full disk: the job cannot report, so it stops (its checkpoint kept)
            snap = self._write_failed(exc)
        for sink in self.sinks:
            sink(snap)
        with self.job.cond:
            events, self._events_shown = self.job.events[self._events_shown:], len(self.job.events)
            evaluated = {describe(entry) for entry in self.job.evaluations.history}  # printed below, once
        for event in events:  # what happened to the job, as lines above the bar (why a worker died, ...)
            if event not in evaluated:
                self.console.print(escape(event), highlight=False, soft_wrap=True)
        for entry in snap["evaluations"]:  # each finished evaluation once, as a line above the bar
            if entry["step"] not in self._evaluations_shown:
                self._evaluations_shown.add(entry["step"])
                values = "  ".join(f"{k} {metric_text(v)}" for k, v in sorted(entry["metrics"].items()))
                self.console.print(f"evaluation at step {entry['step']}: {values or 'no metrics'} "
                                   f"({entry['samples']} samples)")
        if self._progress is not None:
            if not self.job.over:  # once it is over the workers leave: the bar keeps who trained last
                self._workers_shown = snap["workers"]["active"]
            loss = snap["metrics"].get("loss")
            self._progress.update(
                self._bar, completed=snap["progress"]["recordsDone"], total=snap["progress"]["recordsTotal"],
                epoch=f"epoch {snap['epoch']}/{snap['epochs']}",
                loss=metric_text(loss) if loss is not None else "-",
                rate=f"{snap['samplesPerSecond']:,.0f}", workers=self._workers_shown,
            )
        return snap

    def _write_failed(self, exc: StateWriteError) -> dict:
        """Fail the job naming the write that failed; then try once more to leave its final status."""
        if not self.job.over:
            self.job.finish(Phase.FAILED, f"cannot write the job's status: {exc}{self.job.kept_checkpoint()}")
        snap = self.snapshot()
        self._reserve.unlink(missing_ok=True)  # its space is what the write below needs
        try:
            write_json_atomic(self.path, snap)
        except StateWriteError:
            pass  # the message above reaches the CLI and the ElasticJob; the last good file stays
        return snap

    def close(self) -> None:
        self._reserve.unlink(missing_ok=True)
        if self._progress is not None:
            self._progress.stop()
