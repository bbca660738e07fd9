"""Worker failures: what each one was, and whether the job should go on.

Every exit the master did not ask for is a failure, exit code 0 included.
Its record joins three sources: the worker's own report sent just before it
exited (``ReportFailure``: exception, the user's file and line, traceback),
the exit code or signal the launch backend saw, and why the master itself
killed it (a hang), if it did.

The verdict (:meth:`FailureTracker.exited`):

* infrastructure (a signal: SIGKILL, OOM, preemption, a lost node; or the
  master unreachable): relaunch, as before;
* the module broke its contract, or a loss went non-finite: the job fails at
  once, since no relaunch can fix it;
* anything else the job itself caused (the user's code raised, the process
  exited by itself, it hung and the master killed it): relaunch, unless the same failure happened before with
  no optimizer step committed in between, which makes it the job's failure.
  Like torchrun's "root cause", the reason given is the first of those.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from flextrain.failures import ExitCode, FailureKind, describe_exit, kind_of_exit, signal_name
from flextrain.master.k8s_outcomes import OOM_KILLED
from flextrain.proto import flextrain_pb2 as pb

REPEATS_TO_FAIL = 2  # the same failure this often without progress is the job's, not bad luck
TAIL_LINES = 20


@dataclass(frozen=True)
class WorkerFailure:
    worker_id: str
    kind: FailureKind
    exit_code: int | None = None
    exception: str = ""
    message: str = ""
    location: str = ""
    traceback: str = ""
    stage: str = ""
    step: int = 0
    log: str = ""
    reason: str = ""  # the master's or the cluster's reason: "killed by the master: ...", "OOMKilled"
    time: float = field(default_factory=time.time)

    @property
    def signature(self) -> tuple:
        """Failures with equal signatures are "the same error" (times, ids and steps aside)."""
        if self.exception:
            return self.kind, self.exception, self.message, self.location
        return self.kind, self.exit_code  # an unreported exit: its output (timestamps, pids) varies

    def cause(self) -> str:
        """The failure in a phrase: the exception and where, else the exit."""
        if self.exception:
            at = f" (at {self.location})" if self.location else ""
            return f"{self.exception}: {self.message}{at}"
        if self.message:
            return self.message
        return f"exited with {describe_exit(self.exit_code)}" if self.exit_code is not None else self.kind.value

    def summary(self) -> str:
        """One line for the console and the job's events."""
        how = f"exit {describe_exit(self.exit_code)}" if self.exit_code is not None else "an error"
        extra = f" — {self.reason}" if self.reason else ""
        if self.exception:
            return f"{self.worker_id} failed ({how}): {self.cause()}{extra}"
        return f"{self.worker_id} {self.cause()}{extra}"

    def to_status(self) -> dict:
        """The ``failure`` object of status.json and of the ElasticJob status."""
        status = {"worker": self.worker_id, "kind": self.kind.value, "exitCode": self.exit_code,
                  "signal": signal_name(self.exit_code) if self.exit_code is not None else None,
                  "exception": self.exception, "message": self.message, "location": self.location,
                  "stage": self.stage, "step": self.step, "traceback": self.traceback, "log": self.log,
                  "reason": self.reason}
        return {k: v for k, v in status.items() if v not in (None, "")}


def from_report(worker_id: str, report: pb.Failure, *, log: str = "") -> WorkerFailure:
    try:
        kind = FailureKind(report.kind)
    except ValueError:
        kind = FailureKind.INTERNAL
    return WorkerFailure(worker_id, kind, exit_code=report.exit_code or None, exception=report.exception,
                         message=report.message, location=report.location, traceback=report.traceback,
                         stage=report.stage, step=report.step, log=log)


@dataclass(frozen=True)
class Verdict:
    failure: WorkerFailure | None  # None: not a failure (an expected exit)
    relaunch: bool
    fatal: WorkerFailure | None = None  # the root cause when the job must fail


class FailureTracker:
    """Pure bookkeeping of failures; the master calls it under its own lock.

    ``log_of(worker_id)`` names where a worker's output is (a file, or how to
    get a pod's logs); ``tail_of(worker_id)`` returns the end of it when the
    worker reported nothing (or ``""`` where it cannot be read).
    """

    def __init__(self, *, log_of: Callable[[str], str] = lambda w: "",
                 tail_of: Callable[[str], str] = lambda w: "") -> None:
        self._log_of, self._tail_of = log_of, tail_of
        self._reports: dict[str, pb.Failure] = {}
        self._killed: dict[str, str] = {}  # worker -> why the master killed it
        self._seen: dict[tuple, tuple[WorkerFailure, int, int]] = {}  # signature -> (first, count, step)
        self.history: list[WorkerFailure] = []

    def log_of(self, worker_id: str) -> str:
        return self._log_of(worker_id)

    def reported(self, worker_id: str, report: pb.Failure) -> None:
        self._reports[worker_id] = report

    def killing(self, worker_id: str, why: str) -> None:
        self._killed[worker_id] = why

    def exited(self, worker_id: str, code: int, *, step: int) -> Verdict:
        """Judge an exit the master did not ask for; ``step`` is the job's model version now."""
        report = self._reports.pop(worker_id, None)
        killed = self._killed.pop(worker_id, None)
        if code == ExitCode.RELEASED:
            return Verdict(None, relaunch=True)
        failure = self._failure(worker_id, code, report, killed)
        self.history.append(failure)
        if failure.kind in (FailureKind.INFRASTRUCTURE, FailureKind.MASTER_LOST):
            return Verdict(failure, relaunch=True)
        if failure.kind in (FailureKind.MODULE_CONTRACT, FailureKind.NON_FINITE):
            return Verdict(failure, relaunch=False, fatal=failure)
        previous = self._seen.get(failure.signature)
        if previous is None or previous[2] != step:  # a committed step in between: maybe bad luck
            self._seen[failure.signature] = (failure, 1, step)
        else:
            self._seen[failure.signature] = (previous[0], previous[1] + 1, step)
        first, count, _ = self._seen[failure.signature]
        if count >= REPEATS_TO_FAIL:
            return Verdict(failure, relaunch=False, fatal=first)
        return Verdict(failure, relaunch=True)

    def ended_job(self, failure: WorkerFailure) -> None:
        """``failure`` ends the job without an exit to judge (a worker's task report: a task out of retries,
        a broken contract): kept with the others, so the job's history records what ended it."""
        self.history.append(failure)

    def root_cause(self) -> WorkerFailure | None:
        """The failure to name when the job fails for want of workers: the first of the job's own
        making since the last progress, else the latest."""
        own = [f for f in self.history if f.kind.user_caused]
        return own[0] if own else (self.history[-1] if self.history else None)

    def _failure(self, worker_id: str, code: int, report: pb.Failure | None, killed: str | None) -> WorkerFailure:
        log = self.log_of(worker_id)
        if killed is not None:  # hanging again and again with no progress is the job's own doing
            return WorkerFailure(worker_id, FailureKind.HANG, exit_code=code, log=log, message=f"hangs: {killed}",
                                 reason="killed by the master", traceback=self._tail_of(worker_id))
        if report is not None and report.kind:
            return dataclasses.replace(from_report(worker_id, report, log=log), exit_code=code)
        kind = kind_of_exit(code)
        if kind in (FailureKind.INFRASTRUCTURE, FailureKind.MASTER_LOST):
            return WorkerFailure(worker_id, kind, exit_code=code, log=log, traceback=self._tail_of(worker_id))
        # A worker reports every error it can catch, sys.exit() included: this one was ended from
        # inside without a word (os._exit(), a crash in native code), or exited 0 unasked.
        message = (f"exited with code {code} by itself while the job was running, without reporting an error"
                   + (" (os._exit() or a crash in native code?)" if code else " (before the master told it to stop)"))
        tail = self._tail_of(worker_id)
        if tail.strip():
            message += f"; its output ends with: {tail.strip()[-600:]}"
        return WorkerFailure(worker_id, FailureKind.UNEXPECTED_EXIT, exit_code=code, message=message,
                             traceback=tail, log=log)


class FailureHandling:
    """The JobMaster's side of worker failures, apart for size: a mixin of JobMaster, whose lock,
    phase, ledger, tracker (``failures``) and ``fail``/``note`` it uses; every method takes the lock."""

    def worker_failed(self, worker_id: str, code: int, *, reason: str = "") -> bool:
        """An exit the launcher did not ask for; returns whether to launch a replacement. ``reason``: the
        launch backend's (``OOMKilled``: the worker was killed for memory, flextrain/master/oom.py)."""
        with self.cond:
            if self.over or self.stopping or (code == 0 and worker_id in self.dismissed):
                return False  # leaving because the job is over, stopping, or done with it
            verdict = self.failures.exited(worker_id, code, step=self.step)
            if verdict.failure is not None and reason == OOM_KILLED:
                verdict = dataclasses.replace(verdict, failure=dataclasses.replace(verdict.failure, reason=reason))
                self.failures.history[-1] = verdict.failure
                self._out_of_memory(verdict.failure)  # may fail the job (at micro-batch 1): no relaunch then
            elif verdict.failure is not None:
                self.note(verdict.failure.summary())
            if verdict.relaunch and not self.over:  # by cause, for the metrics (flextrain_relaunches_total)
                cause = verdict.failure.kind.value if verdict.failure is not None else "Released"
                self.relaunch_causes[cause] = self.relaunch_causes.get(cause, 0) + 1
            if verdict.fatal is not None:
                root = verdict.fatal
                why = ("no relaunch can fix it" if root.kind in (FailureKind.MODULE_CONTRACT, FailureKind.NON_FINITE)
                       else "the same failure again with no step trained in between")
                self.fail(root, failed_message(root, why + self._last_good(root)))
            return verdict.relaunch and not self.over

    def _out_of_memory(self, failure: WorkerFailure) -> None:
        """An OOMKilled worker: a higher rung of the memory ladder, or half the micro-batch, or (at 1) the
        job fails (flextrain/master/oom.py). Its M is the largest of the rounds this process (id and pid) was
        in: memory a bigger micro-batch took stays with the process (allocator caches, the peak), so a worker
        killed just after a re-plan to a smaller M was killed for the bigger one. Killed before its first
        round: the M it would have planned with."""
        info = self.workers.get(failure.worker_id)
        pid = info.pid if info is not None else None
        ms = [r["maxMicroBatch"] for r in self.round_history
              if any(m["id"] == failure.worker_id and m["pid"] == pid for m in r["members"])]
        m = max(ms) if ms else self.micro_batches.oom.limit(self.micro_batches.current)
        action, fatal = self.micro_batches.oom.killed(failure.worker_id, round_m=m)
        self.note(action)
        if fatal:
            self.fail(failure, f"{action}; the model does not fit the worker's memory even one sample at a "
                      "time: give the workers more memory (--worker-memory-limit, resources.limits.memory or "
                      "replicaSpecs.worker.memoryLadder)")

    def _last_good(self, failure: WorkerFailure) -> str:
        """For a non-finite model: the checkpoint to go back to (all checkpoints are finite)."""
        if failure.kind is not FailureKind.NON_FINITE:
            return ""
        latest = self.checkpoints.latest() if self.checkpoints else None
        return (f"; last good checkpoint: {latest['checkpoint']} (step {latest['version']})" if latest
                else "; no checkpoint was written before it")

    def relaunches_exhausted(self, message: str) -> None:
        """The relaunch budget is spent: fewer than the minimum of workers now means the job cannot go on."""
        with self.cond:
            self.relaunching = False
            self.note(message)
            self.cond.notify_all()

    def report_failure(self, worker_id: str, report: pb.Failure) -> None:
        """A worker's own account of its failure, sent just before it exits."""
        with self.cond:
            self.failures.reported(worker_id, report)

    def _task_failed(self, req: pb.ReportTaskRequest) -> None:
        failure = from_report(req.worker_id, req.failure, log=self.failures.log_of(req.worker_id))
        if self.ledger.error:  # that was the task's last retry
            message = self.ledger.error + (f" (log: {failure.log})" if failure.log else "")
        elif failure.kind in (FailureKind.MODULE_CONTRACT, FailureKind.NON_FINITE):
            message = failed_message(failure, "no retry can fix it")  # not bad records
        else:
            return  # the task is retried
        if not self.over:
            self.failures.ended_job(failure)
        self.fail(failure, message)


def failed_message(failure: WorkerFailure, why: str) -> str:
    """The job's message when ``failure`` ends it: the worker's own error first, then why it is final."""
    return f"{failure.worker_id} failed: {failure.cause()}; {why}" + (f" (log: {failure.log})" if failure.log else "")


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


@functools.cache
def _field_of_flag() -> dict[str, str]:
    from flextrain.job import SETTINGS

    fields = {}
    for s in SETTINGS:
        if s.crd and s.option.startswith("--"):
            fields[s.option] = f"{s.crd}: false" if s.option.startswith("--no-") else s.crd
    return fields


def in_spec_words(text: str) -> str:
    """``text`` with every ``flextrain train`` flag of a setting replaced by its ElasticJob field
    (``--min-workers`` -> ``spec.replicaSpecs.worker.minReplicas``): what a Kubernetes user wrote.
    Text between backticks (a command to run) is left as it is."""
    fields = _field_of_flag()
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = _FLAG.sub(lambda m: fields.get(m.group(0), m.group(0)), parts[i])
    return "`".join(parts)


def log_tail(path, *, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
    except OSError:
        return ""


def failure_lines(failure: dict | None, *, traceback_lines: int = 12) -> list[str]:
    """The root cause as ``flextrain train`` and ``flextrain status`` print it."""
    if not failure:
        return []
    lines = [f"  root cause: {failure['worker']} ({failure['kind']}"
             + (f", exit code {failure['exitCode']}" if failure.get("exitCode") is not None else "")
             + (f", {failure['signal']}" if failure.get("signal") else "") + ")"]
    if failure.get("exception"):
        lines.append(f"  error: {failure['exception']}: {failure.get('message', '')}")
    elif failure.get("message"):
        lines.append(f"  error: {failure['message'].splitlines()[0]}")
    for key, label in (("location", "at"), ("stage", "while"), ("reason", "reason"), ("log", "log")):
        if failure.get(key):
            lines.append(f"  {label}: {failure[key]}")
    if failure.get("traceback"):
        tail = failure["traceback"].rstrip().splitlines()[-traceback_lines:]
        lines += ["  traceback (most recent call last, end):", *("    " + t for t in tail)]
    return lines


__all__ = ["FailureHandling", "FailureTracker", "Verdict", "WorkerFailure", "failed_message", "failure_lines",
           "from_report", "in_spec_words", "log_tail"]
