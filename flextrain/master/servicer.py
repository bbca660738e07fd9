"""gRPC servicer: translates Master RPCs into JobMaster calls."""

from __future__ import annotations

from concurrent import futures
from typing import Callable

import grpc

from flextrain.master.coordinator import JobMaster
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc

# How long a JoinRendezvous call may block before answering WAIT; clients
# re-ask, so a long poll costs one RPC per this many seconds while waiting.
JOIN_LONG_POLL = 5.0


class MasterServicer(pb_grpc.MasterServicer):
    def __init__(
        self,
        job: JobMaster,
        *,
        status_json: Callable[[], str],
        stop: Callable[[str], tuple[bool, str]],
        scale: Callable[[int], tuple[bool, str]],
        heartbeat_interval: float,
    ) -> None:
        self.job = job
        self._status_json = status_json
        self._stop = stop
        self._scale = scale
        self.heartbeat_interval = heartbeat_interval

    def GetJobSpec(self, request, context):
        return pb.GetJobSpecResponse(job_spec_json=self.job.spec.to_json(),
                                     heartbeat_interval=self.heartbeat_interval,
                                     ps_addresses=list(self.job.ps_addresses))

    def RegisterWorker(self, request, context):
        self.job.register(request.worker_id, pid=request.pid,
                          probe=request.probe if request.HasField("probe") else None)
        return pb.RegisterWorkerResponse()

    def Accelerate(self, request, context):
        try:
            return self.job.accelerate(request)
        except ValueError as exc:  # a strategy that is not JSON
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"strategy_json: {exc}")

    def JoinRendezvous(self, request, context):
        return self.job.join(request.worker_id, request.position, wait=JOIN_LONG_POLL)

    def GetTask(self, request, context):
        try:
            return self.job.get_task(request)
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def ReportTask(self, request, context):
        self.job.report_task(request)
        return pb.ReportTaskResponse()

    def Heartbeat(self, request, context):
        return self.job.heartbeat(request)

    def ReportCheckpoint(self, request, context):
        self.job.report_checkpoint(request)
        return pb.ReportCheckpointResponse()

    def ReportFailure(self, request, context):
        self.job.report_failure(request.worker_id, request.failure)
        return pb.ReportFailureResponse()

    def GetStatus(self, request, context):
        return pb.GetStatusResponse(status_json=self._status_json())

    def Stop(self, request, context):
        accepted, message = self._stop(request.reason or "stopped by user")
        return pb.StopResponse(accepted=accepted, message=message)

    def Scale(self, request, context):
        accepted, message = self._scale(request.workers)
        return pb.ScaleResponse(accepted=accepted, message=message)


def start_server(servicer: MasterServicer, *, host: str, port: int, threads: int) -> tuple[grpc.Server, int]:
    """Start the gRPC server; returns it and the bound port (``port=0``: any free port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="master-rpc"))
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"master could not listen on {host}:{port}")
    server.start()
    return server, bound
