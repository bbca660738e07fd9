"""MasterClient: the worker's gRPC calls, each with a deadline and retries.

A call that fails with a transient status (UNAVAILABLE, DEADLINE_EXCEEDED,
RESOURCE_EXHAUSTED) is retried with exponential backoff until ``give_up``
seconds have passed, then :class:`MasterUnreachable` names the master
address and the call (DESIGN.md, "Wire rules").
"""

from __future__ import annotations

import time

import grpc

from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc
from flextrain.protocol.limits import MASTER_MESSAGE_OPTIONS, MAX_TEXT_CHARS
from flextrain.protocol.security import JobCredentials, open_channel

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}


class MasterUnreachable(RuntimeError):
    pass


class MasterClient:
    def __init__(self, address: str, worker_id: str, *, give_up: float = 60.0, deadline: float = 10.0,
                 creds: JobCredentials | None = None) -> None:
        """``creds``: the job's TLS material and token (--tls), which the parameter servers want too."""
        self.address = address
        self.worker_id = worker_id
        self.give_up = give_up
        self.deadline = deadline
        self.creds = creds
        self.channel = open_channel(address, creds, options=MASTER_MESSAGE_OPTIONS)
        self.stub = pb_grpc.MasterStub(self.channel)

    def _call(self, name: str, request, *, deadline: float | None = None, give_up: float | None = None):
        method = getattr(self.stub, name)
        give_up = self.give_up if give_up is None else give_up
        delay, started = 0.05, time.monotonic()
        while True:
            try:
                return method(request, timeout=deadline or self.deadline)
            except grpc.RpcError as exc:
                code = exc.code()
                if code not in _TRANSIENT:
                    raise
                if time.monotonic() - started > give_up:
                    raise MasterUnreachable(
                        f"master at {self.address} did not answer {name} for {give_up:.0f}s "
                        f"(last error: {code.name}: {exc.details()})"
                    ) from exc
                time.sleep(delay)  # backoff between retries of a failed call
                delay = min(delay * 2, 2.0)

    def job_spec(self) -> pb.GetJobSpecResponse:
        return self._call("GetJobSpec", pb.GetJobSpecRequest(worker_id=self.worker_id))

    def register(self, *, pid: int, probe: pb.MicroBatchProbe | None = None,
                 node_check: pb.NodeCheck | None = None) -> pb.RegisterWorkerResponse:
        """Ready to train; ``probe``: what --max-micro-batch auto measured (before any round is joined);
        ``node_check``: what --node-check timed. A non-empty ``refused`` in the answer: leave."""
        import socket

        from flextrain.worker.nodecheck import node_name

        return self._call(
            "RegisterWorker",
            pb.RegisterWorkerRequest(worker_id=self.worker_id, host=socket.gethostname(), pid=pid, probe=probe,
                                     node_check=node_check, node=node_name()),
        )

    def probe_link(self, *, nbytes: int, rounds: int) -> pb.ProbeLinkResponse:
        """--node-check: where to meet the master for a link probe (flextrain/protocol/linkprobe.py)."""
        return self._call("ProbeLink", pb.ProbeLinkRequest(worker_id=self.worker_id, bytes=nbytes, rounds=rounds))

    def park(self, *, pid: int) -> pb.ParkResponse:
        """A spare's long poll (flextrain/worker/parked.py): TAKEN, STOP, or WAIT (ask again)."""
        return self._call("Park", pb.ParkRequest(worker_id=self.worker_id, pid=pid), deadline=30.0)

    def accelerate(self, *, strategy_json: str = "", search_json: str = "") -> pb.AccelerateResponse:
        """--accelerate auto: ask for the job's strategy, or send the one this worker's search chose."""
        return self._call("Accelerate", pb.AccelerateRequest(worker_id=self.worker_id, strategy_json=strategy_json,
                                                             search_json=search_json))

    def join(self, position: pb.Position, reason: str, detail: str = "", *,
             exited_peers=()) -> pb.JoinRendezvousResponse:
        return self._call(
            "JoinRendezvous",
            pb.JoinRendezvousRequest(worker_id=self.worker_id, position=position, reason=reason, detail=detail,
                                     exited_peers=exited_peers),
            deadline=30.0,
        )

    def get_task(self, *, round_id: int, task_index: int, position: pb.Position,
                 kind: int = pb.Task.TRAINING, model_version: int = 0, count: int = 1) -> pb.GetTaskResponse:
        """``count``: a training task and up to ``count - 1`` more after it (``more``), when its
        answer is a RUN."""
        return self._call(
            "GetTask",
            pb.GetTaskRequest(worker_id=self.worker_id, round_id=round_id, task_index=task_index,
                              position=position, kind=kind, model_version=model_version,
                              ahead_count=count if count > 1 else 0),
        )

    def get_task_ahead(self, *, round_id: int, task_index: int, position: pb.Position,
                       count: int = 1) -> "grpc.Future":
        """Ask for training task ``task_index`` (and up to ``count - 1`` more after it) while the
        one before it still runs (one try, no retries: :meth:`get_task` is the fallback). The
        answer is a RUN or nothing (WAIT)."""
        return self.stub.GetTask.future(
            pb.GetTaskRequest(worker_id=self.worker_id, round_id=round_id, task_index=task_index,
                              position=position, kind=pb.Task.TRAINING, ahead=True, ahead_count=count),
            timeout=self.deadline,
        )

    def report_failure(self, failure: pb.Failure, *, give_up: float = 10.0) -> None:
        """Tell the master why this worker is about to exit (a short give-up: it exits either way)."""
        self._call("ReportFailure", pb.ReportFailureRequest(worker_id=self.worker_id, failure=failure),
                   deadline=5.0, give_up=give_up)

    def report_task(self, task_id: int, *, ok: bool, steps_done: int = 0, error: str = "",
                    metric_sums: dict[str, float] | None = None, samples: int = 0,
                    metric_states: dict | None = None, failure: pb.Failure | None = None) -> None:
        """``metric_states``: name -> (kind, additive state vector) of mergeable metrics."""
        states = {name: pb.MetricState(kind=kind, values=[float(v) for v in values])
                  for name, (kind, values) in (metric_states or {}).items()}
        self._call(
            "ReportTask",
            pb.ReportTaskRequest(worker_id=self.worker_id, task_id=task_id, ok=ok, steps_done=steps_done,
                                 error=error[-MAX_TEXT_CHARS:], metric_sums=metric_sums or {}, samples=samples,
                                 metric_states=states, failure=failure),
        )

    def report_checkpoint(self, path: str, position: pb.Position, *, final: bool, stop: bool = False,
                          memory: bool = False, give_up: float | None = None) -> None:
        """``memory``: a persisted flash snapshot (the master records it with the ledger it resolved for
        the snapshot's position); ``give_up``: seconds of retries (None: the client's)."""
        self._call("ReportCheckpoint", pb.ReportCheckpointRequest(
            worker_id=self.worker_id, path=path, position=position, final=final, stop=stop, memory=memory),
            give_up=give_up)

    def heartbeat(self, position: pb.Position, loss: float | None, samples: int, *, waiting_for_peers: bool = False,
                  stalled_seconds: float = 0.0, skipped_steps: int = 0, lr_gain: float = 0.0,
                  gradient_noise_scale: float | None = None,
                  memory: pb.MemorySample | None = None,
                  compute: tuple[float, int] = (0.0, 0),
                  ps_traffic: pb.PSTraffic | None = None, step: int = 0,
                  wait: float = 0.0) -> pb.HeartbeatResponse:
        """``lr_gain`` and ``gradient_noise_scale``: --lr-rule adascale's last step (0 and None: none yet);
        ``memory``: the latest sample of this process's memory (None: none yet); ``compute``: seconds
        computed and samples computed on since the last heartbeat (the straggler figure); ``ps_traffic``:
        the parameter-server calls since the last heartbeat (None: none); ``step``: a script's
        latest reported step (flextrain.elastic.progress; 0: none); ``wait``: seconds the master may
        hold the answer until the round ends, a stop or the job's end (a long poll; 0: at once)."""
        return self._call(
            "Heartbeat",
            pb.HeartbeatRequest(worker_id=self.worker_id, position=position, loss=loss, samples=samples,  # None: unset
                                waiting_for_peers=waiting_for_peers, stalled_seconds=stalled_seconds,
                                skipped_steps=skipped_steps, lr_gain=lr_gain,
                                gradient_noise_scale=gradient_noise_scale, memory=memory,
                                compute_seconds=compute[0], compute_samples=compute[1], ps_traffic=ps_traffic,
                                step=step, wait_seconds=wait),
            deadline=5.0 + wait,
        )

    def close(self) -> None:
        self.channel.close()
