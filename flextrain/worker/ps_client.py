"""PSClient: a worker's view of the parameter servers (``proto/ps.proto``).

Routing follows :mod:`flextrain.protocol.shard`; tensors and the bulk streams are
encoded by :mod:`flextrain.protocol.codec` and :mod:`flextrain.protocol.wire`: the protocol
modules shared with the PS (no PS internals are imported). Calls fan out to
the PS in parallel. Every attempt has a deadline (longer for big streams); a call
failing with UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED is retried
with exponential backoff, so a PS that is relaunched within ``give_up``
seconds is simply reconnected to; beyond that :class:`PSUnavailable` names
the address. Bad input rejected by a PS (INVALID_ARGUMENT) raises ValueError
with the PS's message; FAILED_PRECONDITION raises :class:`PSError`.

Versions are per PS (a PS restored from an older checkpoint is behind the
others). The client remembers, per PS, the version and incarnation of the
parameters it last pulled; ``version`` is the highest of them. Pushes quote
each PS's own base version, and a retried push is never applied twice
(``client_id``/``seq`` de-duplication on the PS).

Exactly once per minibatch: a push may name its minibatch (``step=(task_id,
start, end)``); each PS applies a task's records at most once, whoever
pushes them, and answers a repeat as a duplicate. :meth:`PSClient.task_progress`
asks every PS how far a task got, so a worker taking over a requeued task
skips what every PS already has. :meth:`PSClient.flush` applies the gradients
a SYNC PS collected but did not apply yet (the job's last pushes).

Embedding rows (their layout by owning PS, pulls, sparse pushes) are
:mod:`flextrain.worker.ps_rows`; this module holds the transport and the dense
parameters.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import grpc
import numpy as np
import torch

from flextrain.proto import ps_pb2 as pb
from flextrain.proto import ps_pb2_grpc as pb_grpc
from flextrain.protocol.codec import LayoutView, dense_sources, dense_targets, dtype_name, hyper_to_wire, raw_bytes
from flextrain.protocol.limits import PS_MESSAGE_OPTIONS
from flextrain.protocol.security import JobCredentials, open_channel
from flextrain.protocol.shard import as_row_ids, dense_owner
from flextrain.protocol.wire import PUSH_DENSE_TAG, Scatter, fields, gather_chunks
from flextrain.worker.ps_rows import check_out, distinct_rows, pull_rows, sparse_push_blocks
from flextrain.worker.state import Traffic

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
_CHANNEL_OPTIONS = [  # reconnect quickly to a relaunched PS instead of gRPC's default backoff of up to 2 min
    ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000), *PS_MESSAGE_OPTIONS]
_MODES = {"sync": pb.SyncConfig.SYNC, "async": pb.SyncConfig.ASYNC}


class PSUnavailable(RuntimeError):
    """A PS did not answer within ``give_up`` seconds."""


class PSError(RuntimeError):
    """A PS refused a request it cannot serve in its current state."""


@dataclass(frozen=True)
class PushResult:
    accepted: bool                 # every PS accepted the gradients
    version: int                   # highest PS version after the push
    versions: tuple[int, ...]      # per PS
    applied: bool                  # some PS applied an update because of this push
    messages: tuple[str, ...]      # per PS (why a push was rejected or is pending)
    duplicates: tuple[bool, ...] = ()  # per PS: the step's records were accepted there before (not applied again)


def _serialize(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


class _Stub:
    """The generated stub, plus the bulk streams with byte-level (de)serialisers (flextrain.protocol.wire)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.rpc = pb_grpc.ParameterServerStub(channel)
        prefix = "/" + pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name
        self.push = channel.stream_unary(f"{prefix}/PushGradients", request_serializer=_serialize,
                                         response_deserializer=pb.PushResponse.FromString)
        self.pull = channel.unary_stream(f"{prefix}/PullDense",
                                         request_serializer=pb.PullDenseRequest.SerializeToString)
        self.rows = channel.unary_stream(f"{prefix}/PullEmbedding",
                                         request_serializer=pb.PullEmbeddingRequest.SerializeToString)


class PSClient:
    """Client of ``len(addresses)`` PS, address ``i`` being PS shard ``i``.

    One training thread should drive a client: push/pull are not meant to be
    called concurrently on the same instance (they update its per-PS versions).
    """

    def __init__(self, addresses: Sequence[str], *, give_up: float = 60.0, deadline: float = 30.0,
                 chunk_bytes: int = 1 << 20, client_id: str | None = None,
                 traffic: Traffic | None = None, creds: JobCredentials | None = None) -> None:
        """``traffic``: where the time and bytes of every push and pull are added up (a worker's heartbeat
        sends them to the master's metrics)."""
        if not addresses:
            raise ValueError("PSClient needs at least one parameter-server address")
        self.addresses = list(addresses)
        self.num_ps = len(self.addresses)
        self.give_up, self.deadline, self.chunk_bytes = give_up, deadline, chunk_bytes
        self.client_id = client_id or uuid.uuid4().hex
        self.creds = creds  # --tls: the job's material and token
        self._channels = [open_channel(a, creds, options=_CHANNEL_OPTIONS) for a in self.addresses]
        self._stubs = [_Stub(c) for c in self._channels]
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * self.num_ps), thread_name_prefix="ps-client")
        self._layouts: list[LayoutView | None] = [None] * self.num_ps
        self._versions = [-1] * self.num_ps        # of the dense parameters last pulled, per PS
        self._row_versions = [-1] * self.num_ps    # of the embedding rows last pulled, per PS
        self._incarnations = [0] * self.num_ps
        self._tables: dict[str, tuple[int, torch.dtype]] = {}
        self._seq = 0
        self.traffic = traffic or Traffic()

    # ------------------------------------------------------------------ plumbing

    @property
    def version(self) -> int:
        """Highest PS version among the parameters this client last pulled (-1: none yet)."""
        return max(self.versions)

    @property
    def versions(self) -> tuple[int, ...]:
        """Per PS, the version gradients are computed from: that of the dense parameters last
        pulled, or for a PS never pulled dense from, that of the embedding rows last pulled."""
        return tuple(d if d >= 0 else r for d, r in zip(self._versions, self._row_versions))

    def set_address(self, index: int, address: str) -> None:
        """Point PS ``index`` at a new address (e.g. relaunched on another host or port)."""
        self._channels[index].close()
        self.addresses[index] = address
        self._channels[index] = open_channel(address, self.creds, options=_CHANNEL_OPTIONS)
        self._stubs[index] = _Stub(self._channels[index])

    def _call(self, i: int, what: str, attempt: Callable[[_Stub, float], object],
              nbytes: int = 0):
        """Run ``attempt(stub, timeout)`` against PS ``i`` with retries (see the module docstring)."""
        timeout = self.deadline + nbytes / 20e6  # big streams get time for the bytes at >= 20 MB/s
        delay, started = 0.05, time.monotonic()
        while True:
            try:
                return attempt(self._stubs[i], timeout)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()
                where = f"parameter server {i} at {self.addresses[i]}"
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ValueError(f"{where} rejected {what}: {details}") from None
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    raise PSError(f"{where} cannot serve {what}: {details}") from None
                if code not in _TRANSIENT:
                    raise PSError(f"{where}: {what} failed: {code.name}: {details}") from exc
                if time.monotonic() - started + delay > self.give_up:
                    raise PSUnavailable(f"{where} did not answer {what} for {self.give_up:g}s "
                                        f"(last error: {code.name}: {details})") from exc
                time.sleep(delay)  # backoff, then retry on a channel that reconnects by itself
                delay = min(delay * 2, 1.0)

    def _unary(self, i: int, method: str, request):
        return self._call(i, method, lambda s, t: getattr(s.rpc, method)(request, timeout=t))

    def _fanout(self, fn: Callable[[int], object], targets: Iterable[int] | None = None) -> list:
        targets = list(range(self.num_ps) if targets is None else targets)
        return [fn(targets[0])] if len(targets) == 1 else list(self._pool.map(fn, targets))

    # ------------------------------------------------------------------ setup

    def describe(self) -> list[pb.DescribeResponse]:
        """Every PS's state (version, incarnation, layout, tables, settings), by PS index."""
        return self._fanout(lambda i: self._unary(i, "Describe", pb.DescribeRequest()))

    def configure(self, optimizer: str | None = None, hyper: Mapping[str, object] | None = None, *,
                  mode: str | None = None, grads_to_wait: int | None = None, version_tolerance: int | None = None,
                  staleness_lr: bool | None = None, max_staleness: int | None = None) -> None:
        """Set the optimizer on every PS (first writer wins) and/or change sync settings (unset: unchanged)."""
        if mode is not None and mode not in _MODES:
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        sync_args = dict(mode=mode, grads_to_wait=grads_to_wait, version_tolerance=version_tolerance,
                         staleness_lr=staleness_lr, max_staleness=max_staleness)

        def one(i: int):
            req = pb.ConfigureRequest(num_ps=self.num_ps)
            if optimizer:
                req.optimizer.CopyFrom(pb.OptimizerConfig(name=optimizer, hyper=hyper_to_wire(hyper)))
            if any(v is not None for v in sync_args.values()):
                req.sync.CopyFrom(self._unary(i, "Describe", pb.DescribeRequest()).sync)  # keeps unset fields
                for key, value in sync_args.items():
                    if value is not None:
                        setattr(req.sync, key, _MODES[value] if key == "mode" else value)
            return self._unary(i, "Configure", req)
        self._fanout(one)

    def declare_table(self, name: str, dim: int, *, initializer: str = "normal",
                      init_args: Mapping[str, float] | None = None, seed: int = 0, dtype: str = "float32") -> None:
        """Declare an embedding table on every PS (idempotent; a conflicting redeclaration is a ValueError)."""
        req = pb.DeclareTablesRequest(tables=[pb.TableSpec(name=name, dim=dim, dtype=dtype, initializer=initializer,
                                                           init_args=dict(init_args or {}), seed=seed)])
        self._fanout(lambda i: self._unary(i, "DeclareTables", req))
        self._tables[name] = (dim, getattr(torch, dtype))

    def init_dense(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> int:
        """Give every PS its initial dense parameters; a PS already holding them keeps its values.

        Returns the resulting :attr:`version`; callers joining a running job then
        ``pull_dense(None)`` to get the current values.
        """
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        parts: list[list[tuple[str, torch.Tensor]]] = [[] for _ in range(self.num_ps)]
        for name, tensor in items:
            parts[dense_owner(name, self.num_ps)].append((name, tensor))

        def one(i: int):
            info = self._unary(i, "Describe", pb.DescribeRequest())
            if info.dense_initialized:
                return info.layout, info.version, info.incarnation
            layout = pb.DenseLayout(tensors=[pb.TensorSpec(name=n, dtype=dtype_name(t.dtype), shape=list(t.shape))
                                             for n, t in parts[i]])
            data = memoryview(b"".join(raw_bytes(t) for _, t in parts[i]))  # one-time copy, then sliced

            def requests():
                yield pb.InitDenseChunk(layout=layout)
                for o in range(0, len(data), self.chunk_bytes):
                    yield pb.InitDenseChunk(data=bytes(data[o: o + self.chunk_bytes]))
            r = self._call(i, "InitDense", lambda s, t: s.rpc.InitDense(requests(), timeout=t), nbytes=len(data))
            return r.layout, r.version, r.incarnation

        for i, (layout, version, incarnation) in enumerate(self._fanout(one)):
            have, want = {t.name for t in layout.tensors}, {n for n, _ in parts[i]}
            if have != want:
                raise ValueError(f"parameter server {i} at {self.addresses[i]} holds parameters "
                                 f"{sorted(have ^ want)[:5]}... that differ from this model's")
            self._layouts[i] = LayoutView.of(layout)
            self._versions[i], self._incarnations[i] = version, incarnation
        return self.version

    # ------------------------------------------------------------------ pull

    def pull_dense(self, version_known: int | None = None, *, wait: float = 0.0,
                   out: Mapping[str, torch.Tensor] | None = None) -> tuple[int, dict[str, torch.Tensor] | None]:
        """(version, parameters of every shard that changed since this client's last pull, or None).

        ``version_known=None`` (or < 0) fetches every parameter. With ``wait > 0``
        each PS whose version is unchanged holds the answer up to ``wait`` s for
        the next update (SYNC mode: returns as soon as the step is applied).
        ``out``: name -> contiguous CPU tensor of the right dtype and shape (e.g.
        the model's parameters) to receive the values in place, with no extra
        copy; the result then holds those very tensors. Without it the result
        holds fresh tensors. If a pull fails midway, ``out`` may be half-updated.
        """
        full = version_known is None or version_known < 0
        began = time.perf_counter()

        def one(i: int):
            req = pb.PullDenseRequest(known_version=-1 if full else self._versions[i],
                                      known_incarnation=self._incarnations[i], wait_seconds=wait,
                                      chunk_bytes=self.chunk_bytes)

            def attempt(stub, timeout):
                stream = stub.pull(req, timeout=timeout + wait)
                head = pb.PullDenseChunk.FromString(next(stream))
                if head.unchanged:
                    return head, None, None
                layout = LayoutView.of(head.layout)
                tensors, segments = dense_targets(layout, out)
                sink = Scatter(segments, layout.total)
                sink.write(head.data)
                for raw in stream:  # read in place: PullDenseChunk.data = 5
                    for field, wt, value in fields(raw):
                        if field == 5 and wt == 2:
                            sink.write(value)
                if not sink.complete:
                    raise ValueError(f"parameter server {i} sent {sink.pos} of {layout.total} bytes")
                return head, layout, tensors
            layout = self._layouts[i]
            return self._call(i, "PullDense", attempt, nbytes=layout.total if layout else 0)

        changed: dict[str, torch.Tensor] = {}
        any_changed = False
        for i, (head, layout, tensors) in enumerate(self._fanout(one)):
            self._versions[i], self._incarnations[i] = head.version, head.incarnation
            if layout is not None:
                any_changed, self._layouts[i] = True, layout
                changed.update(tensors)
        self.traffic.add(pull=True, seconds=time.perf_counter() - began,
                         nbytes=sum(t.numel() * t.element_size() for t in changed.values()))
        return self.version, (changed if any_changed else None)

    def _table(self, table: str) -> tuple[int, torch.dtype]:
        if table not in self._tables:
            for t in self.describe()[0].tables:
                self._tables[t.name] = (t.dim, getattr(torch, t.dtype))
            if table not in self._tables:
                raise ValueError(f"unknown embedding table {table!r}; declare it first")
        return self._tables[table]

    def distinct(self, table: str, ids) -> tuple[np.ndarray, np.ndarray]:
        """``(distinct, inverse)`` of ``table``'s ``ids`` (validated, flattened) in the layout
        :meth:`pull_embedding` and :meth:`push` move fastest; ``distinct[inverse]`` is ``ids``."""
        return distinct_rows(table, ids, self.num_ps)

    def pull_embedding(self, table: str, ids, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows for ``ids`` (any integer array-like), shape ``ids.shape + (dim,)``.

        Duplicates are fetched once; each PS is asked for its rows in parallel.
        Negative ids or ids beyond int64 raise ValueError naming the table and id.
        Ids laid out by :meth:`distinct` (as the PS trainers do) cost the least: every
        PS's rows then land in one range of the result, without a scatter.
        ``out``: a contiguous CPU tensor of that shape and the table's dtype (e.g. reused from
        one pull to the next) to receive the rows in place; it is returned. If a pull fails
        midway, ``out`` may be half-written.
        """
        shape = tuple(np.shape(ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else ids))
        flat = as_row_ids(ids, table)
        dim, dtype = self._table(table)
        if out is not None:
            check_out(out, table=table, shape=shape, dim=dim, dtype=dtype)
        began = time.perf_counter()
        rows = pull_rows(table, flat, shape, dim=dim, dtype=dtype, num_ps=self.num_ps, chunk_bytes=self.chunk_bytes,
                         call=self._call, fanout=self._fanout, row_versions=self._row_versions, out=out)
        self.traffic.add(pull=True, seconds=time.perf_counter() - began, nbytes=rows.numel() * rows.element_size())
        return rows

    # ------------------------------------------------------------------ push

    def push(self, dense_grads: Mapping[str, torch.Tensor | None] | None = None,
             sparse_grads: Mapping[str, tuple[object, torch.Tensor]] | None = None,
             version: int | None = None, *, step: tuple[int, int, int] | None = None) -> PushResult:
        """Send gradients to every PS (an empty push too: SYNC mode counts pushes per PS).

        ``dense_grads``: name -> gradient (None or missing: no gradient, skipped
        like torch). ``sparse_grads``: table -> (ids, rows [len(ids), dim]);
        duplicate ids are summed before sending. ``version``: the version the
        gradients were computed from (default: this client's last pull; a client
        that never pulled sends -1, which SYNC mode rejects as stale).
        ``step``: ``(task_id, start, end)``, the minibatch's records; a PS that
        accepted those records of that task before answers ``duplicates[i]``
        and applies nothing (see the module docstring).
        """
        if step is not None:
            task_id, start, end = (int(x) for x in step)
            if not 0 <= start < end:
                raise ValueError(f"push step: records [{start}, {end}) of task {task_id} are not a range")
        dense_grads = dict(dense_grads or {})
        if dense_grads and any(l is None for l in self._layouts):  # pushing before any pull: ask for them
            for i, info in enumerate(self.describe()):
                self._layouts[i] = LayoutView.of(info.layout) if info.dense_initialized else None
        known = {s[0] for l in self._layouts if l for s in l.specs}
        unknown = sorted(set(dense_grads) - known)
        if unknown:
            raise ValueError(f"gradients for unknown dense parameter(s) {unknown[:5]}; init_dense first")
        blocks = sparse_push_blocks(sparse_grads or {}, table_dim=lambda table: self._table(table)[0],
                                    num_ps=self.num_ps, chunk_bytes=self.chunk_bytes)
        self._seq += 1
        seq, shift = self._seq, 0 if version is None else self.version - version
        bases = self.versions
        began, sent = time.perf_counter(), [0] * self.num_ps

        def one(i: int):
            segments, absent, nbytes = (dense_sources(self._layouts[i], dense_grads)
                                        if dense_grads and self._layouts[i] else ([], [], 0))
            header = pb.PushHeader(client_id=self.client_id, seq=seq, base_version=bases[i] - shift,
                                   layout_id=self._layouts[i].layout_id if nbytes else 0,
                                   dense_bytes=nbytes, absent=absent,
                                   sparse_blocks=sum(b.messages for b in blocks[i]))
            if step is not None:
                header.step.CopyFrom(pb.TaskStep(task_id=task_id, start=start, end=end))

            def requests():
                yield pb.PushChunk(header=header)
                yield from gather_chunks(segments, nbytes, self.chunk_bytes, PUSH_DENSE_TAG)
                for part in blocks[i]:
                    yield from part
            sent[i] = nbytes + sum(b.nbytes for b in blocks[i])
            return self._call(i, "PushGradients", lambda s, t: s.push(requests(), timeout=t), nbytes=sent[i])

        results = self._fanout(one)
        self.traffic.add(pull=False, seconds=time.perf_counter() - began, nbytes=sum(sent))
        versions = tuple(r.version for r in results)
        return PushResult(all(r.accepted for r in results), max(versions), versions,
                          any(r.applied for r in results), tuple(r.message for r in results),
                          tuple(r.duplicate for r in results))

    def task_progress(self, task_id: int) -> tuple[int, ...]:
        """Per PS, the end of the records of task ``task_id`` it accepted (-1: none)."""
        req = pb.TaskProgressRequest(task_ids=[task_id])
        return tuple(r.accepted_until[0] for r in self._fanout(lambda i: self._unary(i, "TaskProgress", req)))

    def flush(self) -> int:
        """Make every SYNC PS apply the gradients it collected so far; returns the highest version."""
        return max(r.version for r in self._fanout(lambda i: self._unary(i, "Flush", pb.FlushRequest())))

    def checkpoint(self) -> list[tuple[str, int]]:
        """Ask every PS to write a checkpoint now; (path, version) per PS."""
        res = self._fanout(lambda i: self._unary(i, "Checkpoint", pb.CheckpointRequest()))
        return [(r.path, r.version) for r in res]

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for channel in self._channels:
            channel.close()
