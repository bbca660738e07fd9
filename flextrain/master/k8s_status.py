"""ElasticJobStatusWriter: the job's status on its ElasticJob (``.status``), from the master.

It is a sink of :class:`~flextrain.master.status.StatusReporter`: every
snapshot the reporter writes to ``status.json`` is offered to it, and it
patches the ElasticJob's status subresource with the CRD's status fields
(``phase``, ``message``, ``workers`` {desired, active, summary, pending, preempted, reason}, ``selector``,
``epoch``, ``step``, ``progress`` {recordsDone, recordsTotal, percent,
summary}, ``metrics``, ``samplesPerSecond``, ``globalBatchSize``, ``maxMicroBatch``, ``accelerate``,
``lrRule``, ``lrFactor``, ``learningRate``, ``gradientNoiseScale``, ``evaluation``, ``prediction``,
``unauthenticatedCalls``, ``startTime``, ``completionTime``,
``conditions``).

Contract: offering a snapshot never blocks the master and never raises. A
background thread patches only when the status changed, at most once per
``min_interval`` seconds; a patch the API server refuses (a webhook, the CRD's
schema, throttling) or never answers is logged, reported by one Warning Event
``StatusRefused`` per distinct reason (the job's Events are then the only
place the user can see it), and the newest status retried after an
exponential backoff (``min_interval`` doubling up to ``RETRY_CAP`` s), so a
flaky API server never kills training and a refusing one is not hammered.
:meth:`close` writes the final status synchronously (bounded by a deadline).
Conditions follow the phase: ``Running`` (True while training, False after),
``Succeeded`` or ``Failed`` when the job ends, each with its transition time;
conditions of other types on the object (the operator's) are kept
(flextrain.k8s.job_status, shared with every other writer of an ended job).
``observedGeneration`` is the ``metadata.generation`` of the ElasticJob the
master read at its start (the spec it runs), when the object has one.

A 404 for a job the writer has seen (``job``, or a read that found it), or an
object of its name with another uid, is no refusal to wait out: the ElasticJob was deleted (``kubectl delete --cascade=orphan``, or
before the garbage collector reached the master pod). The writer stops writing,
says so once in the log, and calls ``on_gone(reason)`` -- the master then stops
the job as ``flextrain stop`` does (a checkpoint at the next step boundary) and
exits, instead of training for a job nobody can see.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flextrain.k8s import job_types, meta
from flextrain.k8s.job_status import conditions_for, observed_generation

log = logging.getLogger(__name__)

RETRY_CAP = 60.0  # the longest wait between two tries of a refused status


class JobGone(Exception):
    """The ElasticJob the master writes to no longer exists (its message says how that was seen)."""


def cr_status(snap: Mapping[str, Any], *, job_name: str) -> dict[str, Any]:
    """The ElasticJob ``.status`` (without conditions) for a StatusReporter snapshot."""
    progress = snap.get("progress") or {}
    workers = snap.get("workers") or {}
    percent = float(progress.get("percent", 0.0))
    status = {
        "phase": snap["phase"],
        "message": snap.get("message") or "",
        "workers": {"desired": int(workers.get("desired", 0)), "active": int(workers.get("active", 0)),
                    "summary": f"{int(workers.get('active', 0))}/{int(workers.get('desired', 0))}",
                    # priority-based elasticity: pods waiting for a node, workers preempted, why fewer are active
                    **{k: workers[k] for k in ("pending", "preempted", "reason") if k in workers}},
        "selector": meta.selector(job_name, "worker"),
        "epoch": int(snap.get("epoch", 0)),
        "step": int(snap.get("step", 0)),
        "progress": {"recordsDone": int(progress.get("recordsDone", 0)),
                     "recordsTotal": int(progress.get("recordsTotal", 0)),
                     "percent": percent, "summary": f"{percent:.1f}%"},
        # a non-finite metric is the string "nan"/"inf"/"-inf" (status.shown): JSON has no NaN
        "metrics": {k: v if isinstance(v, str) else float(v) for k, v in (snap.get("metrics") or {}).items()},
        "samplesPerSecond": float(snap.get("samplesPerSecond", 0.0)),
    }
    for key in ("globalBatchSize", "maxMicroBatch", "lrRule", "lrFactor", "learningRate"):  # training jobs of a module
        if key in snap:
            status[key] = snap[key]
    if isinstance((snap.get("accelerate") or {}).get("strategy"), str):  # --accelerate (auto: once chosen)
        status["accelerate"] = snap["accelerate"]["strategy"]
    if isinstance(snap.get("gradientNoiseScale"), (int, float)):  # not "inf": the CRD field is a number
        status["gradientNoiseScale"] = snap["gradientNoiseScale"]
    status.update(job_types.result_status(snap))  # the latest evaluation; a prediction job's output
    if snap.get("unauthenticatedCalls"):  # spec.tls: calls refused for lacking the job's token
        status["unauthenticatedCalls"] = int(snap["unauthenticatedCalls"])
    for key in ("startTime", "completionTime", "failure", "metricsUrl"):
        if snap.get(key):
            status[key] = snap[key]
    return status


class ElasticJobStatusWriter:
    def __init__(self, api_client, *, namespace: str, name: str, min_interval: float = 1.0,
                 request_timeout: float = 10.0, job: Mapping[str, Any] | None = None,
                 on_gone: Callable[[str], None] = lambda reason: None) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace, self.name = namespace, name
        self.uid = ((job or {}).get("metadata") or {}).get("uid")  # the job as read at the start: its object
        self.generation = observed_generation(job)  # ... and the spec the master runs
        self.on_gone = on_gone
        self.gone: str | None = None  # why the job is known to be deleted
        self.min_interval = min_interval
        self.request_timeout = request_timeout
        self._cond = threading.Condition()
        self._latest: dict | None = None  # newest status offered
        self._written: dict | None = None  # last status the API accepted (without conditions)
        self._conditions: list[dict] = []
        self._closed = False
        self.retry_delay = min_interval  # before the next write: grows while the API server refuses
        self._told = ""  # the refusal last reported in an Event
        self.errors = 0
        self.writes = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"cr-status-{name}")
        self._thread.start()

    def __call__(self, snapshot: Mapping[str, Any]) -> None:
        """Offer a snapshot (the StatusReporter sink); returns at once."""
        status = cr_status(snapshot, job_name=self.name)
        with self._cond:
            self._latest = status
            self._cond.notify()

    def _run(self) -> None:
        last = 0.0
        while True:
            with self._cond:
                while not self._closed and (self._latest is None or self._latest == self._written):
                    self._cond.wait(self.min_interval)
                # the backoff in full: a new snapshot (offered every second or so) wakes the wait, but
                # must not cut it short, or a refusing API server is asked again every second
                due = last + self.retry_delay
                while not self._closed and time.monotonic() < due:
                    self._cond.wait(due - time.monotonic())
                if self._closed or self.gone is not None:
                    return
            self._write_latest()
            last = time.monotonic()

    def _write_latest(self) -> bool:
        with self._cond:
            status = copy.deepcopy(self._latest)
        if status is None or status == self._written or self.gone is not None:
            return True  # nothing new; or no job left to write it to
        current = None
        try:
            # A merge patch replaces the whole list: start from the conditions on the object
            # now, so those the operator writes (e.g. MasterRelaunched) survive.
            current = self._call(self.api.get_namespaced_custom_object)
            self.uid = self.uid or (current.get("metadata") or {}).get("uid")  # seen: a 404 from now on is news
            if self.uid and (current.get("metadata") or {}).get("uid") != self.uid:
                raise JobGone(f"it was deleted and another ElasticJob of its name created (uid "
                              f"{(current.get('metadata') or {}).get('uid')}, not {self.uid})")
            previous = (current.get("status") or {}).get("conditions") or self._conditions
            conditions = conditions_for(status["phase"], status.get("message", ""), previous)
            self._call(self.api.patch_namespaced_custom_object_status,
                       {"status": {**status, "conditions": conditions, **self.generation}})
        except JobGone as gone:
            self._gone(str(gone))
            return True
        except Exception as exc:  # noqa: BLE001 - never fatal: retried with the newest status after a backoff
            self._refused(exc, job=current, phase=status["phase"])
            return False
        self._written, self._conditions = status, conditions
        self.retry_delay, self._told = self.min_interval, ""
        self.writes += 1
        return True

    def _call(self, method, *body):
        """``method`` on this job; :class:`JobGone` for a 404 (the API server's word that it is deleted)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return method(meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL, self.name, *body,
                          _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status == 404 and self.uid:  # not yet seen at all (no ``job`` given): it may be on its way
                raise JobGone(f"it was deleted (the API server answers 404 {exc.reason})") from None
            raise

    def _gone(self, why: str) -> None:
        with self._cond:
            if self.gone is not None:
                return
            self.gone = why
            self._cond.notify_all()
        log.error("ElasticJob %s/%s is gone: %s; the master stops the job (a checkpoint at the next step "
                  "boundary) and exits, writing no more status", self.namespace, self.name, why)
        self.on_gone(f"the ElasticJob {self.namespace}/{self.name} is gone: {why}")

    def _refused(self, exc: Exception, *, job: Mapping[str, Any] | None, phase: str) -> None:
        from flextrain.k8s.refusals import refusal_of

        self.errors += 1
        self.retry_delay = min(RETRY_CAP, self.retry_delay * 2)
        why = refusal_of(exc, what=f'the status of ElasticJob "{self.name}"', action="patch")
        message = f"{why.message()} (the master's status, phase {phase}; retried in {self.retry_delay:.0f}s)"
        log.warning("ElasticJob %s/%s: %s", self.namespace, self.name, message)
        if job is not None and why.text != self._told:  # the patch itself was refused: the job exists
            self._told = why.text
            record_event(self.core, job, reason="StatusRefused", message=message)

    def close(self, *, timeout: float = 10.0) -> bool:
        """Stop the thread and write the newest status now (retrying until ``timeout``)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        while not self._write_latest():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True


def record_event(core, job: Mapping[str, Any], *, reason: str, message: str, warning: bool = True) -> None:
    """Record a core/v1 Event on the ElasticJob (``kubectl describe ej/NAME`` lists it).

    ``core`` is a ``CoreV1Api``. Never raises: an Event is a courtesy, what it reports is
    already in the job's status.
    """
    md = job["metadata"]
    body = meta.job_event(job, reason=reason, message=message, warning=warning, component="master")
    try:
        core.create_namespaced_event(md["namespace"], body)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("could not record event %s on ElasticJob %s/%s: %s", reason, md["namespace"], md["name"], exc)


__all__ = ["ElasticJobStatusWriter", "JobGone", "conditions_for", "cr_status", "record_event"]
