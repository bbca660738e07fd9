"""Master requests checked before the job sees them: hostile or malformed input is refused.

:class:`WireChecks` is a server interceptor of the master's gRPC server: it
runs the check of each RPC on the decoded request and answers
INVALID_ARGUMENT, naming the field and its bound, instead of calling the
servicer. A refused request therefore changes nothing (no worker touched, no
task reported, no file written). The bounds live in flextrain.protocol.limits;
gRPC itself refuses messages above MAX_MASTER_MESSAGE (RESOURCE_EXHAUSTED).

What is checked (values that are the user's, such as losses and metric values,
are left alone: NaN may be what the model produced):

* strings: ids at most MAX_ID_CHARS, free text at most MAX_TEXT_CHARS (workers cut theirs);
* integers that count or index: never negative (a round id of -1 means "none"),
  ahead_count and metric states bounded, steps_done within the reported task;
* seconds: finite and not negative;
* JSON texts (strategy, search report, flash ledger): a JSON object;
* checkpoint paths: a file directly in the job's checkpoint directory.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable

import grpc

from flextrain.master.ledger import TaskKind
from flextrain.proto import flextrain_pb2 as pb
from flextrain.protocol.limits import (MAX_AHEAD_COUNT, MAX_ID_CHARS, MAX_METRIC_VALUES, MAX_TEXT_CHARS,
                                       MAX_WORKERS)
from flextrain.protocol.linkprobe import MAX_BYTES as LINK_PROBE_MAX_BYTES
from flextrain.protocol.linkprobe import MAX_ROUNDS as LINK_PROBE_MAX_ROUNDS


class Refused(ValueError):
    """A request field outside its bound; the message names the field and the bound."""


def _id(name: str, value: str) -> None:
    if len(value) > MAX_ID_CHARS:
        raise Refused(f"{name}: {len(value)} characters, at most {MAX_ID_CHARS}")


def _text(name: str, value: str) -> None:
    if len(value) > MAX_TEXT_CHARS:
        raise Refused(f"{name}: {len(value)} characters, at most {MAX_TEXT_CHARS}")


def _count(name: str, value: int, *, low: int = 0, high: int | None = None) -> None:
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise Refused(f"{name}: {value} must be {bound}")


def _seconds(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise Refused(f"{name}: {value} must be a finite number >= 0")


def _json_object(name: str, text: str) -> None:
    if not text:
        return
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise Refused(f"{name}: not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise Refused(f"{name}: must be a JSON object, got {type(parsed).__name__}")


def _position(name: str, p: pb.Position) -> None:
    _count(f"{name}.round_id", p.round_id, low=-1)
    for field in ("task_index", "steps_done", "version"):
        _count(f"{name}.{field}", getattr(p, field))
    _seconds(f"{name}.lr_gain", p.lr_gain)


def _failure(name: str, f: pb.Failure) -> None:
    _id(f"{name}.kind", f.kind)
    for field in ("exception", "message", "location", "traceback", "stage"):
        _text(f"{name}.{field}", getattr(f, field))
    _count(f"{name}.step", f.step)


# ---- one check per RPC: (request, job) -> None, Refused when a field is out of bounds ----

def _register(r: pb.RegisterWorkerRequest, job) -> None:
    _id("worker_id", r.worker_id), _id("host", r.host), _id("node", r.node)
    _count("pid", r.pid)
    if r.HasField("probe"):
        for field in ("max_micro_batch", "memory_limit", "peak_bytes"):
            _count(f"probe.{field}", getattr(r.probe, field))
        _id("probe.device", r.probe.device)
    if r.HasField("node_check"):
        _seconds("node_check.seconds_per_sample", r.node_check.seconds_per_sample)
        _seconds("node_check.link_seconds_per_mib", r.node_check.link_seconds_per_mib)
        _count("node_check.samples", r.node_check.samples), _count("node_check.steps", r.node_check.steps)


def _park(r: pb.ParkRequest, job) -> None:
    _id("worker_id", r.worker_id), _count("pid", r.pid)


def _accelerate(r: pb.AccelerateRequest, job) -> None:
    _id("worker_id", r.worker_id)
    for field in ("strategy_json", "search_json"):  # bounded by the message size: a search report may be long
        _json_object(field, getattr(r, field))


def _join(r: pb.JoinRendezvousRequest, job) -> None:
    _id("worker_id", r.worker_id), _position("position", r.position)
    _text("reason", r.reason), _text("detail", r.detail)
    if len(r.exited_peers) > MAX_WORKERS:
        raise Refused(f"exited_peers: {len(r.exited_peers)} names, at most {MAX_WORKERS}")
    for peer in r.exited_peers:
        _id("exited_peers", peer)


def _get_task(r: pb.GetTaskRequest, job) -> None:
    _id("worker_id", r.worker_id), _position("position", r.position)
    _count("round_id", r.round_id, low=-1), _count("task_index", r.task_index)
    _count("model_version", r.model_version), _count("ahead_count", r.ahead_count, high=MAX_AHEAD_COUNT)
    if r.kind not in pb.Task.Kind.values():
        raise Refused(f"kind: {r.kind} is not a Task.Kind ({', '.join(pb.Task.Kind.keys())})")


def _report_task(r: pb.ReportTaskRequest, job) -> None:
    _id("worker_id", r.worker_id), _text("error", r.error)
    _count("task_id", r.task_id), _count("samples", r.samples), _count("steps_done", r.steps_done)
    for name in r.metric_sums:
        _id("metric_sums key", name)
    for name, state in r.metric_states.items():
        _id("metric_states key", name), _id(f"metric_states[{name}].kind", state.kind)
        _count(f"metric_states[{name}] values", len(state.values), high=MAX_METRIC_VALUES)
    if r.HasField("failure"):
        _failure("failure", r.failure)
    if job is not None and r.steps_done:
        with job.cond:
            task = job.ledger.doing.get(r.task_id)
            steps = task.steps if task is not None and task.kind is TaskKind.TRAINING else None
        if steps is not None and r.steps_done > steps:
            raise Refused(f"steps_done: {r.steps_done} exceeds the {steps} step(s) of task {r.task_id}")


def _heartbeat(r: pb.HeartbeatRequest, job) -> None:
    _id("worker_id", r.worker_id), _position("position", r.position)
    for field in ("samples", "skipped_steps", "compute_samples"):
        _count(field, getattr(r, field))
    for field in ("stalled_seconds", "compute_seconds", "lr_gain", "wait_seconds"):
        _seconds(field, getattr(r, field))
    if r.HasField("memory"):
        _id("memory.device", r.memory.device)
        for field in ("step", "used_bytes", "peak_bytes", "reserved_bytes"):
            _count(f"memory.{field}", getattr(r.memory, field))


def _checkpoint_path(path: str, job) -> None:
    """A checkpoint is a file directly in the job's checkpoint directory, as the workers write it."""
    if job is None:
        return
    directory = os.path.normpath(job.spec.checkpoint_dir)
    parent, name = os.path.split(os.path.normpath(path)) if path else ("", "")
    if not name or name in (".", "..") or parent != directory:
        raise Refused(f"path: {path!r} is not a file in the job's checkpoint directory {directory}")


def _report_checkpoint(r: pb.ReportCheckpointRequest, job) -> None:
    _id("worker_id", r.worker_id), _position("position", r.position)
    _text("path", r.path), _json_object("ledger_json", r.ledger_json)
    _checkpoint_path(r.path, job)


def _report_failure(r: pb.ReportFailureRequest, job) -> None:
    _id("worker_id", r.worker_id), _failure("failure", r.failure)


def _probe_link(r: pb.ProbeLinkRequest, job) -> None:
    _id("worker_id", r.worker_id)
    _count("bytes", r.bytes, low=4, high=LINK_PROBE_MAX_BYTES)
    _count("rounds", r.rounds, low=1, high=LINK_PROBE_MAX_ROUNDS)


CHECKS: dict[str, Callable] = {
    "GetJobSpec": lambda r, job: _id("worker_id", r.worker_id),
    "RegisterWorker": _register,
    "Park": _park,
    "Accelerate": _accelerate,
    "JoinRendezvous": _join,
    "GetTask": _get_task,
    "ReportTask": _report_task,
    "Heartbeat": _heartbeat,
    "ReportCheckpoint": _report_checkpoint,
    "ReportFailure": _report_failure,
    "Stop": lambda r, job: _text("reason", r.reason),
    "Scale": lambda r, job: _count("workers", r.workers, high=MAX_WORKERS),
    "ProbeLink": _probe_link,
}


def check(method: str, request, job) -> None:
    """Raise :class:`Refused` naming the first field of ``request`` (to RPC ``method``) out of bounds."""
    fn = CHECKS.get(method)
    if fn is not None:
        fn(request, job)


class WireChecks(grpc.aio.ServerInterceptor):
    """Runs :func:`check` before every Master RPC; ``job()`` is the JobMaster (or None) asked about tasks
    and the checkpoint directory."""

    def __init__(self, job: Callable[[], object]) -> None:
        self._job = job

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        method = details.method.rsplit("/", 1)[-1]
        if handler is None or handler.unary_unary is None or method not in CHECKS:
            return handler
        inner = handler.unary_unary

        async def checked(request, context):
            try:
                check(method, request, self._job())
            except Refused as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method} {exc}")
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(checked, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)
