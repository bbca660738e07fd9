"""Relaying a job's desired state to its master over gRPC (Scale, Stop, Suspend).

The master is reached through its Service (``<job>-master``): the Service's
cluster IP and port when it has one (what kube-proxy routes to whichever
master pod runs now), else its DNS name. Every call has a deadline and is
retried with backoff while the master is unavailable (starting, being
relaunched); then :class:`MasterUnreachable` says where and why, and the
caller (a kopf handler) retries later. A job with TLS on (``spec.tls``) is
dialled over TLS with its token, both read from the job's Secret
(:class:`Target`, flextrain/operator/credentials.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from flextrain.k8s import meta
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc
from flextrain.protocol.limits import MASTER_MESSAGE_OPTIONS
from flextrain.protocol.security import JobCredentials, open_channel

log = logging.getLogger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class MasterUnreachable(RuntimeError):
    """The master did not answer within the relay's attempts."""


@dataclass(frozen=True)
class Reply:
    accepted: bool
    message: str


@dataclass(frozen=True)
class Target:
    """Where a job's master listens, and the job's material to dial it with (None: plaintext, no token)."""

    address: str
    creds: JobCredentials | None = None

    def __str__(self) -> str:  # messages name the address, never the material
        return self.address


def _target(target: Target | str) -> Target:
    return target if isinstance(target, Target) else Target(target)


def master_target(service: dict | None, *, job: str, namespace: str) -> str:
    """``host:port`` of a job's master, from its Service object (None: the Service is missing)."""
    if service is None:
        return meta.master_address(job, namespace)
    spec = service.get("spec") or {}
    ports = spec.get("ports") or [{}]
    port = ports[0].get("port", meta.MASTER_PORT)
    ip = spec.get("clusterIP")
    if ip and ip != "None":
        return f"{ip}:{port}"
    return meta.master_address(job, namespace, port)


def _call(target: Target | str, what: str, invoke, *, timeout: float, attempts: int, backoff: float):
    target = _target(target)
    last: grpc.RpcError | None = None
    for attempt in range(attempts):
        with open_channel(target.address, target.creds, options=MASTER_MESSAGE_OPTIONS) as channel:
            try:
                return invoke(pb_grpc.MasterStub(channel), timeout)
            except grpc.RpcError as exc:
                if exc.code() not in _RETRYABLE:
                    raise MasterUnreachable(f"{what} to the master at {target} failed: "
                                            f"{exc.code().name}: {exc.details()}") from exc
                last = exc
        log.info("%s: master at %s unavailable (attempt %d/%d)", what, target, attempt + 1, attempts)
        time.sleep(backoff * (2 ** attempt))
    detail = f"{last.code().name}: {last.details()}" if last is not None else "no attempt made"
    raise MasterUnreachable(f"{what}: the master at {target} did not answer in {attempts} attempts "
                            f"({timeout:.0f}s deadline each): {detail}")


def relay_scale(target: Target | str, workers: int, *, timeout: float = 5.0, attempts: int = 3,
                backoff: float = 0.5) -> Reply:
    """Ask the master to run ``workers`` workers; the master answers whether it accepted."""
    resp = _call(target, f"Scale({workers})",
                 lambda stub, t: stub.Scale(pb.ScaleRequest(workers=workers), timeout=t),
                 timeout=timeout, attempts=attempts, backoff=backoff)
    return Reply(resp.accepted, resp.message)


def relay_stop(target: Target | str, reason: str, *, timeout: float = 5.0, attempts: int = 3,
               backoff: float = 0.5) -> Reply:
    """Ask the master to stop the job at the next step boundary, leaving a checkpoint."""
    resp = _call(target, "Stop", lambda stub, t: stub.Stop(pb.StopRequest(reason=reason), timeout=t),
                 timeout=timeout, attempts=attempts, backoff=backoff)
    return Reply(resp.accepted, resp.message)


def relay_suspend(target: Target | str, suspend: bool, reason: str, *, timeout: float = 5.0, attempts: int = 3,
                  backoff: float = 0.5) -> Reply:
    """Ask the master to suspend (``suspend``) or resume the job (flextrain/master/suspension.py)."""
    resp = _call(target, "Suspend" if suspend else "Resume",
                 lambda stub, t: stub.Suspend(pb.SuspendRequest(suspend=suspend, reason=reason), timeout=t),
                 timeout=timeout, attempts=attempts, backoff=backoff)
    return Reply(resp.accepted, resp.message)


__all__ = ["MasterUnreachable", "Reply", "Target", "master_target", "relay_scale", "relay_stop", "relay_suspend"]
