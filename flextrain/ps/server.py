"""The gRPC face of a PS shard: message <-> ShardState translation, nothing more.

Errors map to status codes clients can act on: bad input (unknown optimizer,
bad ids, mismatched shapes...) is INVALID_ARGUMENT with a message that names
the culprit; a request the PS cannot serve yet (no optimizer, parameters not
initialised, optimizer already set differently) is FAILED_PRECONDITION.
Nothing received is unpickled or evaluated: tensors are parsed from dtype,
shape and raw bytes, with sizes checked before any allocation.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import threading
from concurrent import futures
from itertools import chain

import grpc
from google.protobuf.message import DecodeError

from flextrain.proto import ps_pb2 as pb
from flextrain.proto import ps_pb2_grpc as pb_grpc
from flextrain.ps.checkpoint import Checkpointer
from flextrain.protocol.codec import decode_sparse_block, encode_rows, ids_from_proto
from flextrain.protocol.security import JobCredentials, TokenInterceptor, add_port
from flextrain.ps.dense import Spec, check_specs
from flextrain.ps.embedding import TableSpec
from flextrain.ps.state import PreconditionError, ShardState, SyncSettings
from flextrain.protocol.limits import MAX_CHUNK, MAX_TASK_IDS, MIN_CHUNK, PS_MESSAGE_OPTIONS
from flextrain.protocol.wire import Encoder, Scatter, fields

log = logging.getLogger(__name__)
MAX_WAIT = 60.0                           # longest long-poll a PullDense may ask for
# An InitDense announcing more than the machine's memory cannot be served; the buffer grows as
# bytes arrive, so an announcement alone allocates nothing.
MAX_DENSE_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
_MODES = {pb.SyncConfig.SYNC: "sync", pb.SyncConfig.ASYNC: "async"}


def _rpc(method):
    """Turn ValueError (and undecodable protobuf)/PreconditionError into INVALID_ARGUMENT/FAILED_PRECONDITION."""
    def code_for(exc):
        return grpc.StatusCode.FAILED_PRECONDITION if isinstance(exc, PreconditionError) \
            else grpc.StatusCode.INVALID_ARGUMENT
    refused = (ValueError, PreconditionError, DecodeError)

    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self, request, context):
            try:
                yield from method(self, request, context)
            except refused as exc:
                context.abort(code_for(exc), str(exc))
        return stream

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except refused as exc:
            context.abort(code_for(exc), str(exc))
    return unary


# ---------------------------------------------------------------- conversions

def sync_to_proto(s: SyncSettings) -> pb.SyncConfig:
    return pb.SyncConfig(mode=pb.SyncConfig.ASYNC if s.mode == "async" else pb.SyncConfig.SYNC,
                         grads_to_wait=s.grads_to_wait, version_tolerance=s.version_tolerance,
                         staleness_lr=s.staleness_lr, max_staleness=s.max_staleness)


def sync_from_proto(m: pb.SyncConfig) -> SyncSettings:
    if m.mode not in _MODES:
        raise ValueError(f"unknown sync mode {m.mode}")
    return SyncSettings(_MODES[m.mode], m.grads_to_wait, m.version_tolerance, m.staleness_lr, m.max_staleness)


def layout_to_proto(store) -> pb.DenseLayout:
    if store is None:
        return pb.DenseLayout()
    return pb.DenseLayout(
        tensors=[pb.TensorSpec(name=s.name, dtype=s.dtype, shape=s.shape, offset=s.offset) for s in store.layout],
        total_bytes=store.total_bytes, layout_id=store.layout_id)


def table_to_proto(spec: TableSpec) -> pb.TableSpec:
    return pb.TableSpec(name=spec.name, dim=spec.dim, dtype=spec.dtype, initializer=spec.initializer,
                        init_args=spec.init_args, seed=spec.seed)


def table_from_proto(m: pb.TableSpec) -> TableSpec:
    return TableSpec(m.name, m.dim, m.dtype or "float32", m.initializer or "normal", dict(m.init_args), m.seed)


class PSServicer(pb_grpc.ParameterServerServicer):
    def __init__(self, shard: ShardState, *, checkpointer: Checkpointer | None = None,
                 chunk_bytes: int = 1 << 20, max_waiters: int = 16) -> None:
        self.shard = shard
        self.checkpointer = checkpointer
        self.chunk_bytes = min(max(chunk_bytes, MIN_CHUNK), MAX_CHUNK)
        # Long polls hold a handler thread each; beyond this many at once, PullDense answers at
        # once instead, so waiting pulls can never occupy every thread and starve the pushes
        # they are waiting for.
        self.max_waiters = max_waiters
        self._waiters = 0
        self._waiters_lock = threading.Lock()
        self._layout: tuple[object, pb.DenseLayout] | None = None  # (store, its message): built once

    def _layout_of(self, store) -> pb.DenseLayout:
        cached = self._layout
        if cached is None or cached[0] is not store:
            cached = self._layout = (store, layout_to_proto(store))
        return cached[1]

    def _chunk(self, asked: int) -> int:
        return min(max(asked, MIN_CHUNK), MAX_CHUNK) if asked > 0 else self.chunk_bytes

    @_rpc
    def Configure(self, request, context):
        opt = None
        if request.HasField("optimizer") and request.optimizer.name:
            opt = (request.optimizer.name, dict(request.optimizer.hyper))
        sync = sync_from_proto(request.sync) if request.HasField("sync") else None
        optimizer, sync, version = self.shard.configure(optimizer=opt, sync=sync, num_ps=request.num_ps)
        resp = pb.ConfigureResponse(sync=sync_to_proto(sync), version=version)
        if optimizer is not None:
            resp.optimizer.CopyFrom(pb.OptimizerConfig(name=optimizer.name, hyper=optimizer.hyper))
        return resp

    @_rpc
    def Describe(self, request, context):
        info = self.shard.info()
        resp = pb.DescribeResponse(
            shard_index=info["shard_index"], num_ps=info["num_ps"], version=info["version"],
            incarnation=info["incarnation"], dense_initialized=info["dense"] is not None,
            layout=layout_to_proto(info["dense"]), tables=[table_to_proto(t) for t in info["tables"]],
            table_rows=info["table_rows"], sync=sync_to_proto(info["sync"]), pending_pushes=info["pending"])
        if info["optimizer"] is not None:
            resp.optimizer.CopyFrom(pb.OptimizerConfig(name=info["optimizer"].name, hyper=info["optimizer"].hyper))
        return resp

    @_rpc
    def InitDense(self, request_iterator, context):
        it = iter(request_iterator)
        first = next(it, None)
        if first is None or not first.HasField("layout"):
            raise ValueError("InitDense must start with the layout")
        specs = [Spec(t.name, t.dtype, tuple(t.shape)) for t in first.layout.tensors]
        check_specs(specs)  # before allocating: dtypes and shapes decide the size
        total = sum(s.nbytes for s in specs)
        if total > MAX_DENSE_BYTES:
            raise ValueError(f"InitDense layout: {total} bytes announced; a PS shard holds at most "
                             f"{MAX_DENSE_BYTES} (its machine's memory)")
        data = bytearray()  # grows with what arrives: the announcement alone allocates nothing
        for msg in chain([first], it):
            if len(data) + len(msg.data) > total:
                raise ValueError(f"InitDense data: more than the {total} bytes its layout needs")
            data += msg.data
        if len(data) != total:
            raise ValueError(f"InitDense data: ended after {len(data)} of {total} bytes")
        initialized, version, store = self.shard.init_dense(specs, data)
        return pb.InitDenseResponse(initialized=initialized, version=version, layout=layout_to_proto(store),
                                    incarnation=self.shard.incarnation)

    @_rpc
    def DeclareTables(self, request, context):
        specs = self.shard.declare_tables([table_from_proto(t) for t in request.tables])
        return pb.DeclareTablesResponse(tables=[table_to_proto(s) for s in specs])

    @_rpc
    def PullDense(self, request, context):
        if not math.isfinite(request.wait_seconds):
            raise ValueError(f"PullDense wait_seconds: {request.wait_seconds} is not a number of seconds")
        wait = min(max(request.wait_seconds, 0.0), MAX_WAIT)
        with self._waiters_lock:
            if wait > 0 and self._waiters >= self.max_waiters:
                wait = 0.0
            self._waiters += wait > 0
        try:
            unchanged, version, store, chunks = self.shard.pull_dense(
                request.known_version, request.known_incarnation, wait, self._chunk(request.chunk_bytes))
        finally:
            with self._waiters_lock:
                self._waiters -= wait > 0
        head = pb.PullDenseChunk(unchanged=unchanged, version=version, incarnation=self.shard.incarnation)
        if not unchanged:
            head.layout.CopyFrom(self._layout_of(store))
        yield head
        yield from chunks  # PullDenseChunk{data} messages, serialised once per version and shared

    @_rpc
    def PullEmbedding(self, request, context):
        ids = ids_from_proto(request.ids, request.table)
        # An empty answer is one message with zero rows. Encoded by hand: the gathered
        # rows are copied once more, into the message.
        for rows, version in self.shard.pull_row_blocks(request.table, ids, self._chunk(request.chunk_bytes)):
            yield bytes(Encoder().message_field(1, encode_rows(rows)).varint_field(2, version))

    @_rpc
    def PushGradients(self, request_iterator, context):
        # Requests arrive as raw bytes (see add_to_server) and are read in place
        # (flextrain.protocol.wire): dense pieces go straight into a recycled buffer.
        it = iter(request_iterator)
        first = list(fields(next(it, b"")))
        header = next((v for f, wt, v in first if f == 1 and wt == 2), None)
        if header is None:
            raise ValueError("PushGradients must start with a header")
        h = pb.PushHeader.FromString(header)
        dense = None
        if h.dense_bytes:
            store = self.shard.dense
            if store is None or h.dense_bytes != store.total_bytes:  # checked before allocating
                raise ValueError(f"push announces {h.dense_bytes} dense bytes; PS {self.shard.shard_index} "
                                 f"holds {store.total_bytes if store else 0}")
            dense = self.shard.receive_buffer(h.dense_bytes)
        sink = Scatter([(0, memoryview(dense))] if dense is not None else [], len(dense) if dense else 0)
        sparse = []

        def consume(items) -> None:
            for field, wt, value in items:
                if field == 2 and wt == 2:      # PushChunk.dense
                    sink.write(value)           # ValueError beyond the announced size
                elif field == 3 and wt == 2:    # PushChunk.sparse
                    sparse.append(decode_sparse_block(value))

        consume(x for x in first if x[0] != 1)
        for raw in it:
            consume(fields(raw))
        if not sink.complete:
            raise ValueError(f"push ended after {sink.pos} of {sink.total} dense bytes")
        if len(sparse) != h.sparse_blocks:  # a stream cut short may end like a complete one
            raise ValueError(f"push announces {h.sparse_blocks} sparse blocks and sent {len(sparse)}")
        step = (h.step.task_id, h.step.start, h.step.end) if h.HasField("step") else None
        result = self.shard.push(client_id=h.client_id, seq=h.seq, base_version=h.base_version,
                                 layout_id=h.layout_id, dense=dense, absent=list(h.absent), sparse=sparse, step=step)
        return pb.PushResponse(accepted=result.accepted, version=result.version, message=result.message,
                               incarnation=self.shard.incarnation, applied=result.applied,
                               duplicate=result.duplicate)

    @_rpc
    def TaskProgress(self, request, context):
        if len(request.task_ids) > MAX_TASK_IDS:
            raise ValueError(f"TaskProgress task_ids: {len(request.task_ids)} ids, at most {MAX_TASK_IDS}")
        return pb.TaskProgressResponse(accepted_until=self.shard.task_progress(request.task_ids))

    @_rpc
    def Flush(self, request, context):
        applied, version = self.shard.flush()
        return pb.FlushResponse(applied=applied, version=version)

    @_rpc
    def Checkpoint(self, request, context):
        if self.checkpointer is None:
            return pb.CheckpointResponse(path="", version=self.shard.version)
        path, version = self.checkpointer.save(self.shard)
        return pb.CheckpointResponse(path=str(path), version=version)


def _refused(method: str) -> None:
    log.warning("refused a call to %s without the job's token (--tls)", method)


def _serialize(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_to_server(servicer: PSServicer, server: grpc.Server) -> None:
    """Register every RPC of ``proto/ps.proto``'s ParameterServer with its protobuf (de)serialisers,
    except the bulk streams: PushGradients gets raw request bytes, and PullDense and
    PullEmbedding may yield pre-encoded messages (flextrain.protocol.wire). The wire format
    is the same either way."""
    service = pb.DESCRIPTOR.services_by_name["ParameterServer"]
    handlers = {}
    for method in service.methods:
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        deserialize = None if method.name == "PushGradients" else request_cls.FromString
        serialize = _serialize if method.name in ("PullDense", "PullEmbedding") else response_cls.SerializeToString
        kind = {(False, False): grpc.unary_unary_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}[(method.client_streaming,
                                                                       method.server_streaming)]
        handlers[method.name] = kind(getattr(servicer, method.name), request_deserializer=deserialize,
                                     response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def start_server(servicer: PSServicer, *, host: str = "0.0.0.0", port: int = 0,
                 threads: int = 32, creds: JobCredentials | None = None) -> tuple[grpc.Server, int]:
    """Start serving; returns the server and its bound port (``port=0``: any free port).

    SO_REUSEPORT is off so a second PS on the same port fails loudly instead of
    silently sharing the traffic. Message size limits: flextrain.protocol.limits
    (every stream is chunked below them).
    """
    interceptors = [TokenInterceptor(creds.token, on_refused=_refused)] if creds is not None else None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ps-rpc"),
                         options=[("grpc.so_reuseport", 0), *PS_MESSAGE_OPTIONS], interceptors=interceptors)
    add_to_server(servicer, server)
    try:
        bound = add_port(server, f"{host}:{port}", creds)
    except RuntimeError as exc:  # grpc raises rather than returning 0 in recent versions
        raise OSError(f"parameter server could not listen on {host}:{port}: {exc}") from exc
    if bound == 0:
        raise OSError(f"parameter server could not listen on {host}:{port}")
    server.start()
    return server, bound
