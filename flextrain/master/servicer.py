"""gRPC servicer: translates Master RPCs into JobMaster calls.

The server is asyncio (``grpc.aio``) on a thread of its own: one event loop serves every worker's
calls. The frequent ones (Heartbeat, GetTask, ReportTask, RegisterWorker, JoinRendezvous) run inline
on the loop: each is a short JobMaster call under its lock. A thread per call, as a thread-pool
server has, made a thousand workers' calls queue for the lock and the GIL (bench/master_scale.py:
heartbeat p50 over a second at 1,000 workers). JoinRendezvous's long poll holds no thread: it waits on
a future that is resolved when a change of the job (``ChangeCondition.listeners``) gives it an
answer, or until waiting alone makes a round due. Rare calls that may block (file writes, status, launching
processes) run in the loop's thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent import futures
from typing import Callable

import grpc

from flextrain.master.coordinator import JobMaster
from flextrain.master.spares import SparePool
from flextrain.master.wire_checks import WireChecks
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc
from flextrain.protocol.limits import MASTER_MESSAGE_OPTIONS
from flextrain.protocol.linkprobe import all_reduce_probe
from flextrain.protocol.security import AioTokenInterceptor, JobCredentials, add_port

log = logging.getLogger(__name__)

# How long a JoinRendezvous call may block before answering WAIT; clients
# re-ask, so a long poll costs one RPC per this many seconds while waiting.
JOIN_LONG_POLL = 5.0
PARK_LONG_POLL = 5.0  # the same for a spare's Park
SAMPLE_RECORDS = 8  # GetJobSpecResponse.sample: records a worker feeds to get ready for steps
HEARTBEAT_LONG_POLL = 30.0  # the most a heartbeat's wait_seconds holds its answer (the worker asks for its period)


async def _long_poll(waiting: set, answer, seconds: float):
    """``answer()`` once it is not None, looked at again whenever a future of ``waiting`` is resolved;
    None after ``seconds`` without one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        woken = loop.create_future()
        waiting.add(woken)  # before the check: a change after it resolves this one
        try:
            found = answer()
            left = deadline - loop.time()
            if found is not None or left <= 0:
                return found
            try:
                await asyncio.wait_for(woken, left)
            except asyncio.TimeoutError:
                pass
        finally:
            waiting.discard(woken)


class MasterServicer(pb_grpc.MasterServicer):
    def __init__(
        self,
        job: JobMaster,
        *,
        status_json: Callable[[], str],
        stop: Callable[[str], tuple[bool, str]],
        scale: Callable[[int], tuple[bool, str]],
        heartbeat_interval: float,
        spares: SparePool | None = None,
        suspend: Callable[[bool, str], tuple[bool, str]] | None = None,
    ) -> None:
        self.job = job
        self._suspend = suspend  # (suspend?, reason) -> (accepted, message): flextrain/master/suspension.py
        self._status_json = status_json
        self._stop = stop
        self._scale = scale
        self.heartbeat_interval = heartbeat_interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polls: dict[asyncio.Future, str] = {}  # JoinRendezvous long polls waiting: future -> worker
        self._beats: set[asyncio.Future] = set()  # Heartbeat long polls waiting
        self._beat_key = None  # what their answers depend on, as of the last wake-up
        self._wake_pending = False
        self.spares = spares
        self._parks: set[asyncio.Future] = set()
        self._probes = 0  # ProbeLink calls so far (each probe's store prefix is its own)  # Park long polls waiting (a few: one per spare)

    def refused(self, method: str) -> None:
        """A call without the job's token (--tls): counted for status and metrics, never served."""
        self.job.unauthenticated_calls += 1

    # ---- the long poll's wake-up -------------------------------------------------
    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve on ``loop``: the job's changes wake the long polls waiting there."""
        self._loop = loop
        if self.job is not None:
            self.job.cond.listeners.append(self._notified)
        if self.spares is not None:
            self.spares.listeners.append(self._spares_changed)

    def unbind(self) -> None:
        if self.job is not None and self._notified in self.job.cond.listeners:
            self.job.cond.listeners.remove(self._notified)
        if self.spares is not None and self._spares_changed in self.spares.listeners:
            self.spares.listeners.remove(self._spares_changed)

    def _spares_changed(self) -> None:
        """A spare was taken (or the pool closed), from any thread: every parked poll looks again."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake_parks)

    def _wake_parks(self) -> None:
        for fut in self._parks:
            if not fut.done():
                fut.set_result(None)

    def _notified(self) -> None:
        """Called (under the job's lock, from any thread) when the job changed."""
        if (self._polls or self._beats) and not self._wake_pending and self._loop is not None:
            self._wake_pending = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        """Resolve the long polls the job now answers (one check for all of them: a change, e.g. a
        registration or a task report, mostly answers none, and a poll left waiting costs nothing).
        Heartbeats look again only when what their answer depends on changed (a round's state, a stop)."""
        self._wake_pending = False
        if self._beats and (key := self.job.heartbeat_key()) != self._beat_key:
            self._beat_key = key
            for fut in self._beats:
                if not fut.done():
                    fut.set_result(None)
        if not self._polls:
            return
        answered = set(self.job.joins_answered({w for w in self._polls.values()}))
        for fut, wid in list(self._polls.items()):
            if wid in answered and not fut.done():
                fut.set_result(None)

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # ---- RPCs ------------------------------------------------------------------
    async def GetJobSpec(self, request, context):
        shards = self.job.ledger.shards
        sample = pb.Task(source=shards[0].source, start=shards[0].start,
                         end=min(shards[0].end, shards[0].start + SAMPLE_RECORDS)) if shards else None
        return pb.GetJobSpecResponse(job_spec_json=self.job.spec.to_json(),
                                     heartbeat_interval=self.heartbeat_interval,
                                     ps_addresses=list(self.job.ps_addresses), sample=sample)

    async def RegisterWorker(self, request, context):
        refused = self.job.register(request.worker_id, pid=request.pid,
                                    probe=request.probe if request.HasField("probe") else None,
                                    node_check=request.node_check if request.HasField("node_check") else None,
                                    node=request.node)
        return pb.RegisterWorkerResponse(refused=refused)

    async def Park(self, request, context):
        """A spare's long poll: answered TAKEN once it is taken, STOP when not wanted, else WAIT after
        PARK_LONG_POLL seconds (the spare asks again)."""
        if self.spares is None:  # a job without spares: nothing will ever take this one
            return pb.ParkResponse(action=pb.ParkResponse.STOP)
        def action():
            found = self.spares.park(request.worker_id, request.pid)
            return pb.ParkResponse.STOP if found is None and self.job.over else found

        found = await _long_poll(self._parks, action, PARK_LONG_POLL)
        return pb.ParkResponse(action=pb.ParkResponse.WAIT if found is None else found)

    async def Accelerate(self, request, context):
        try:
            return await self._blocking(self.job.accelerate, request)
        except ValueError as exc:  # a strategy that is not JSON
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"strategy_json: {exc}")

    async def JoinRendezvous(self, request, context):
        job, loop, wid = self.job, asyncio.get_running_loop(), request.worker_id
        job.join_enter(wid, request.position, exited=request.exited_peers)
        deadline = loop.time() + JOIN_LONG_POLL
        while True:
            woken = loop.create_future()
            self._polls[woken] = wid  # before the poll: a change after it resolves this one
            try:
                resp = job.join_poll(wid)
                if resp is not None:
                    return resp
                left = deadline - loop.time()
                if left <= 0:
                    return pb.JoinRendezvousResponse(action=pb.JoinRendezvousResponse.WAIT)
                due = job.rendezvous_due_in()  # a round due by time alone (the straggler timeout)
                try:
                    await asyncio.wait_for(woken, left if due is None else min(left, due + 0.001))
                except asyncio.TimeoutError:
                    pass
            finally:
                self._polls.pop(woken, None)

    async def GetTask(self, request, context):
        try:
            return self.job.get_task(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def ReportTask(self, request, context):
        self.job.report_task(request)
        return pb.ReportTaskResponse()

    async def Heartbeat(self, request, context):
        """Recorded at once; answered at once, or with ``wait_seconds`` as a long poll that returns as
        soon as the worker's round ends, it must stop or the job is over."""
        resp = self.job.heartbeat(request)
        if request.wait_seconds <= 0 or resp.end_round or resp.stop or resp.job_over:
            return resp
        found = await _long_poll(self._beats, lambda: self.job.heartbeat_news(request.position.round_id),
                                 min(request.wait_seconds, HEARTBEAT_LONG_POLL))
        return found if found is not None else self.job.heartbeat_answer(request.position.round_id)

    async def ReportCheckpoint(self, request, context):
        if request.memory:  # an in-memory snapshot's mark: a ledger to JSON under the lock, no file (inline)
            return self.job.report_checkpoint(request)
        return await self._blocking(self.job.report_checkpoint, request)  # records the checkpoint in files

    async def ReportFailure(self, request, context):
        await self._blocking(self.job.report_failure, request.worker_id, request.failure)
        return pb.ReportFailureResponse()

    async def GetStatus(self, request, context):
        return pb.GetStatusResponse(status_json=await self._blocking(self._status_json))

    async def Stop(self, request, context):
        accepted, message = await self._blocking(self._stop, request.reason or "stopped by user")
        return pb.StopResponse(accepted=accepted, message=message)

    async def Scale(self, request, context):  # may launch processes
        accepted, message = await self._blocking(self._scale, request.workers)
        return pb.ScaleResponse(accepted=accepted, message=message)

    async def Suspend(self, request, context):  # may launch processes (a resume)
        if self._suspend is None:
            return pb.SuspendResponse(accepted=False, message="this master cannot suspend a job")
        reason = request.reason or ("suspended by user" if request.suspend else "resumed by user")
        accepted, message = await self._blocking(self._suspend, request.suspend, reason)
        return pb.SuspendResponse(accepted=accepted, message=message)

    async def ProbeLink(self, request, context):
        """--node-check: take part, as rank 0, in a new worker's all-reduce probe (a thread of its own: it
        waits for the worker on gloo); the answer says where the worker meets it."""
        self._probes += 1
        prefix = f"probe/{request.worker_id}/{self._probes}"
        host, port = self.job.store_host, self.job.store_port
        threading.Thread(target=_probe_side, name=f"probe-{request.worker_id}", daemon=True,
                         kwargs=dict(host=host, port=port, prefix=prefix, nbytes=request.bytes,
                                     rounds=request.rounds)).start()
        return pb.ProbeLinkResponse(store_host=host, store_port=port, prefix=prefix)


def _probe_side(**probe) -> None:
    try:
        all_reduce_probe(rank=0, **probe)
    except Exception as exc:  # noqa: BLE001 - the worker's side reports the probe; the master only logs
        log.warning("link probe %s failed on the master's side: %s", probe["prefix"], exc)


class MasterServer:
    """The asyncio gRPC server on its own thread and event loop; ``stop`` ends both."""

    def __init__(self, servicer: MasterServicer, *, host: str, port: int, threads: int,
                 creds: JobCredentials | None = None) -> None:
        self.servicer, self.creds = servicer, creds
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(futures.ThreadPoolExecutor(max_workers=max(1, threads),
                                                                  thread_name_prefix="master-rpc"))
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, name="master-grpc", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(host, port), self.loop).result(timeout=30)
        except BaseException:
            self._close_loop()
            raise

    async def _start(self, host: str, port: int) -> None:
        self.servicer.bind(asyncio.get_running_loop())
        creds = self.creds
        checks = [AioTokenInterceptor(creds.token, on_refused=self.servicer.refused)] if creds is not None else []
        server = grpc.aio.server(options=MASTER_MESSAGE_OPTIONS,  # bounds: flextrain/protocol/limits.py
                                 interceptors=[*checks, WireChecks(lambda: self.servicer.job)])
        pb_grpc.add_MasterServicer_to_server(self.servicer, server)
        bound = add_port(server, f"{host}:{port}", creds)
        if bound == 0:
            raise OSError(f"master could not listen on {host}:{port}")
        await server.start()
        self._server, self.port = server, bound

    def stop(self, grace: float | None = None) -> None:
        """Stop serving (calls in flight get ``grace`` seconds) and end the loop's thread."""
        if not self._thread.is_alive():
            return
        try:
            if self._server is not None:
                asyncio.run_coroutine_threadsafe(self._server.stop(grace), self.loop).result(
                    timeout=(grace or 0) + 10)
        finally:
            self.servicer.unbind()
            self._close_loop()

    def _close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


def start_server(servicer: MasterServicer, *, host: str, port: int, threads: int,
                 creds: JobCredentials | None = None) -> tuple[MasterServer, int]:
    """Start the gRPC server; returns it and the bound port (``port=0``: any free port). ``threads``
    sizes the pool of the calls that may block (the frequent ones run on the event loop). ``creds``:
    TLS and the job's token (every call without it refused, flextrain/protocol/security.py)."""
    server = MasterServer(servicer, host=host, port=port, threads=threads, creds=creds)
    return server, server.port
