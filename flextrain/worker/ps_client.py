"""PSClient: a worker's view of the parameter servers (``proto/ps.proto``).

Routing follows :mod:`flextrain.ps.shard` (the routing rule is part of the wire
contract; nothing else of ``flextrain.ps`` is imported). Calls fan out to the
PS in parallel. Every attempt has a deadline (longer for big streams); a call
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

from flextrain.proto import flextrain_pb2 as fpb
from flextrain.proto import ps_pb2 as pb
from flextrain.proto import ps_pb2_grpc as pb_grpc
from flextrain.ps.shard import as_row_ids, dense_owner, row_owners

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
_CHANNEL_OPTIONS = [  # reconnect quickly to a relaunched PS instead of gRPC's default backoff of up to 2 min
    ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000)]
_MAX_IDS_PER_REQUEST = 384 * 1024  # 3 MiB of int64 ids: under the default 4 MiB message limit
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


@dataclass
class _Layout:
    specs: list        # [(name, torch dtype, shape, offset, nbytes)]
    total: int
    layout_id: int

    @classmethod
    def of(cls, m: pb.DenseLayout) -> "_Layout":
        specs = []
        for t in m.tensors:
            dtype = getattr(torch, t.dtype)
            numel = int(np.prod(t.shape, dtype=np.int64)) if len(t.shape) else 1
            specs.append((t.name, dtype, tuple(t.shape), t.offset, numel * dtype.itemsize))
        return cls(specs, m.total_bytes, m.layout_id)


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a tensor without copying when it is already contiguous on CPU."""
    t = t.detach().cpu().contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def _pieces(view: memoryview, size: int) -> Iterable[bytes]:
    return (bytes(view[o: o + size]) for o in range(0, len(view), size))


class PSClient:
    def __init__(self, addresses: Sequence[str], *, give_up: float = 60.0, deadline: float = 30.0,
                 chunk_bytes: int = 1 << 20, client_id: str | None = None) -> None:
        if not addresses:
            raise ValueError("PSClient needs at least one parameter-server address")
        self.addresses = list(addresses)
        self.num_ps = len(self.addresses)
        self.give_up, self.deadline, self.chunk_bytes = give_up, deadline, chunk_bytes
        self.client_id = client_id or uuid.uuid4().hex
        self._channels = [grpc.insecure_channel(a, options=_CHANNEL_OPTIONS) for a in self.addresses]
        self._stubs = [pb_grpc.ParameterServerStub(c) for c in self._channels]
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * self.num_ps), thread_name_prefix="ps-client")
        self._layouts: list[_Layout | None] = [None] * self.num_ps
        self._versions = [-1] * self.num_ps
        self._incarnations = [0] * self.num_ps
        self._push_bufs: list[torch.Tensor | None] = [None] * self.num_ps
        self._tables: dict[str, tuple[int, torch.dtype]] = {}
        self._seq = 0

    # ------------------------------------------------------------------ plumbing

    @property
    def version(self) -> int:
        """Highest PS version among the parameters this client last pulled (-1: none yet)."""
        return max(self._versions)

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(self._versions)

    def set_address(self, index: int, address: str) -> None:
        """Point PS ``index`` at a new address (e.g. relaunched on another host or port)."""
        self._channels[index].close()
        self.addresses[index] = address
        self._channels[index] = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stubs[index] = pb_grpc.ParameterServerStub(self._channels[index])

    def _call(self, i: int, what: str, attempt: Callable[[pb_grpc.ParameterServerStub, float], object],
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
                delay = min(delay * 2, 2.0)

    def _fanout(self, fn: Callable[[int], object], targets: Iterable[int] | None = None) -> list:
        targets = list(range(self.num_ps) if targets is None else targets)
        if len(targets) == 1:
            return [fn(targets[0])]
        return list(self._pool.map(fn, targets))

    # ------------------------------------------------------------------ setup

    def describe(self) -> list[pb.DescribeResponse]:
        return self._fanout(lambda i: self._call(i, "Describe", lambda s, t: s.Describe(pb.DescribeRequest(),
                                                                                        timeout=t)))

    def configure(self, optimizer: str | None = None, hyper: Mapping[str, object] | None = None, *,
                  mode: str | None = None, grads_to_wait: int | None = None, version_tolerance: int | None = None,
                  staleness_lr: bool | None = None, max_staleness: int | None = None) -> None:
        """Set the optimizer on every PS (first writer wins) and/or change sync settings (unset: unchanged)."""
        flat: dict[str, float] = {}
        for key, value in (hyper or {}).items():
            if key == "betas":  # torch spelling; the wire has no tuples
                flat["beta1"], flat["beta2"] = (float(v) for v in value)
            else:
                flat[key] = float(value)
        sync_args = dict(mode=mode, grads_to_wait=grads_to_wait, version_tolerance=version_tolerance,
                         staleness_lr=staleness_lr, max_staleness=max_staleness)
        if mode is not None and mode not in _MODES:
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")

        def one(i: int):
            req = pb.ConfigureRequest(num_ps=self.num_ps)
            if optimizer:
                req.optimizer.CopyFrom(pb.OptimizerConfig(name=optimizer, hyper=flat))
            if any(v is not None for v in sync_args.values()):
                current = self._call(i, "Describe", lambda s, t: s.Describe(pb.DescribeRequest(), timeout=t)).sync
                req.sync.CopyFrom(current)
                for key, value in sync_args.items():
                    if value is not None:
                        setattr(req.sync, key, _MODES[value] if key == "mode" else value)
            return self._call(i, "Configure", lambda s, t: s.Configure(req, timeout=t))

        self._fanout(one)

    def declare_table(self, name: str, dim: int, *, initializer: str = "normal",
                      init_args: Mapping[str, float] | None = None, seed: int = 0, dtype: str = "float32") -> None:
        """Declare an embedding table on every PS (idempotent; a conflicting redeclaration is a ValueError)."""
        spec = pb.TableSpec(name=name, dim=dim, dtype=dtype, initializer=initializer,
                            init_args=dict(init_args or {}), seed=seed)
        req = pb.DeclareTablesRequest(tables=[spec])
        self._fanout(lambda i: self._call(i, "DeclareTables", lambda s, t: s.DeclareTables(req, timeout=t)))
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
            info = self._call(i, "Describe", lambda s, t: s.Describe(pb.DescribeRequest(), timeout=t))
            if info.dense_initialized:
                return info.layout, info.version, info.incarnation
            layout = pb.DenseLayout(tensors=[pb.TensorSpec(name=n, dtype=str(t.dtype).removeprefix("torch."),
                                                           shape=list(t.shape)) for n, t in parts[i]])
            data = memoryview(b"".join(_raw(t) for _, t in parts[i]))  # one-time copy, then sliced

            def requests():
                yield pb.InitDenseChunk(layout=layout)
                for piece in _pieces(data, self.chunk_bytes):
                    yield pb.InitDenseChunk(data=piece)
            r = self._call(i, "InitDense", lambda s, t: s.InitDense(requests(), timeout=t), nbytes=len(data))
            return r.layout, r.version, r.incarnation

        for i, (layout, version, incarnation) in enumerate(self._fanout(one)):
            have, want = {t.name for t in layout.tensors}, {n for n, _ in parts[i]}
            if have != want:
                raise ValueError(f"parameter server {i} at {self.addresses[i]} holds parameters "
                                 f"{sorted(have ^ want)[:5]}... that differ from this model's")
            self._layouts[i] = _Layout.of(layout)
            self._versions[i], self._incarnations[i] = version, incarnation
        return self.version

    # ------------------------------------------------------------------ pull

    def pull_dense(self, version_known: int | None = None, *, wait: float = 0.0
                   ) -> tuple[int, dict[str, torch.Tensor] | None]:
        """(version, parameters of every shard that changed since this client's last pull, or None).

        ``version_known=None`` (or < 0) fetches every parameter. With ``wait > 0``
        each PS whose version is unchanged holds the answer up to ``wait`` s for
        the next update (SYNC mode: returns as soon as the step is applied).
        """
        full = version_known is None or version_known < 0

        def one(i: int):
            req = pb.PullDenseRequest(known_version=-1 if full else self._versions[i],
                                      known_incarnation=self._incarnations[i], wait_seconds=wait,
                                      chunk_bytes=self.chunk_bytes)

            def attempt(stub, timeout):
                stream = stub.PullDense(req, timeout=timeout + wait)
                head = next(stream)
                if head.unchanged:
                    return head, None, None
                layout = _Layout.of(head.layout)
                buf, pos = bytearray(layout.total), 0
                for msg in stream:
                    buf[pos: pos + len(msg.data)] = msg.data
                    pos += len(msg.data)
                if pos != layout.total:
                    raise ValueError(f"parameter server {i} sent {pos} of {layout.total} bytes")
                return head, layout, buf
            layout = self._layouts[i]
            return self._call(i, "PullDense", attempt, nbytes=layout.total if layout else 0)

        changed: dict[str, torch.Tensor] = {}
        any_changed = False
        for i, (head, layout, buf) in enumerate(self._fanout(one)):
            self._versions[i], self._incarnations[i] = head.version, head.incarnation
            if layout is None:
                continue
            any_changed, self._layouts[i] = True, layout
            for name, dtype, shape, offset, nbytes in layout.specs:
                # Views into the received buffer: no copy per tensor.
                changed[name] = (torch.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
                                 .view(shape) if nbytes else torch.zeros(shape, dtype=dtype))
        return self.version, (changed if any_changed else None)

    def _table(self, table: str) -> tuple[int, torch.dtype]:
        if table not in self._tables:
            for t in self.describe()[0].tables:
                self._tables[t.name] = (t.dim, getattr(torch, t.dtype))
            if table not in self._tables:
                raise ValueError(f"unknown embedding table {table!r}; declare it first")
        return self._tables[table]

    def pull_embedding(self, table: str, ids) -> torch.Tensor:
        """Rows for ``ids`` (any integer array-like), shape ``ids.shape + (dim,)``.

        Duplicates are fetched once; each PS is asked for its rows in parallel.
        Negative ids or ids beyond int64 raise ValueError naming the table and id.
        """
        shape = tuple(np.shape(ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else ids))
        flat = as_row_ids(ids, table)
        dim, dtype = self._table(table)
        uniq, inverse = np.unique(flat, return_inverse=True)
        owners = row_owners(uniq, self.num_ps)
        order = np.argsort(owners, kind="stable")        # group each PS's rows contiguously
        bounds = np.concatenate([[0], np.cumsum(np.bincount(owners, minlength=self.num_ps))])
        sorted_ids = uniq[order]
        row_bytes = dim * dtype.itemsize
        out = np.empty((len(uniq), row_bytes), dtype=np.uint8)

        def one(i: int):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            for a in range(lo, hi, _MAX_IDS_PER_REQUEST):
                b = min(hi, a + _MAX_IDS_PER_REQUEST)
                part = sorted_ids[a:b]
                req = pb.PullEmbeddingRequest(table=table, chunk_bytes=self.chunk_bytes, ids=fpb.Tensor(
                    dtype="int64", shape=[len(part)], data=part.tobytes()))

                def attempt(stub, timeout):
                    pos = a
                    for msg in stub.PullEmbedding(req, timeout=timeout):
                        n = msg.rows.shape[0]
                        if n:
                            out[pos: pos + n] = np.frombuffer(msg.rows.data, dtype=np.uint8).reshape(n, row_bytes)
                        pos += n
                    if pos != b:
                        raise ValueError(f"parameter server {i} sent {pos - a} of {b - a} rows")
                self._call(i, "PullEmbedding", attempt, nbytes=(b - a) * row_bytes)

        self._fanout(one, [i for i in range(self.num_ps) if bounds[i + 1] > bounds[i]])
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[order] = np.arange(len(uniq))
        rows = torch.from_numpy(out).view(dtype)
        return rows[torch.from_numpy(rank[inverse.reshape(-1)])].view(*shape, dim)

    # ------------------------------------------------------------------ push

    def _pack_dense(self, i: int, grads: Mapping[str, torch.Tensor | None]) -> tuple[memoryview, list[str]]:
        layout = self._layouts[i]
        buf = self._push_bufs[i]
        if buf is None or buf.numel() != layout.total:
            buf = self._push_bufs[i] = torch.zeros(layout.total, dtype=torch.uint8)  # reused by later pushes
        absent = []
        for name, dtype, shape, offset, nbytes in layout.specs:
            g = grads.get(name)
            if g is None:
                absent.append(name)
                continue
            if tuple(g.shape) != shape:
                raise ValueError(f"gradient of {name!r} has shape {tuple(g.shape)}, the parameter {shape}")
            if nbytes:
                buf[offset: offset + nbytes].view(dtype).view(shape).copy_(g.detach())
        if len(absent) == len(layout.specs):
            return memoryview(b""), absent
        return memoryview(buf.numpy()), absent

    def push(self, dense_grads: Mapping[str, torch.Tensor | None] | None = None,
             sparse_grads: Mapping[str, tuple[object, torch.Tensor]] | None = None,
             version: int | None = None) -> PushResult:
        """Send gradients to every PS (an empty push too: SYNC mode counts pushes per PS).

        ``dense_grads``: name -> gradient (None or missing: no gradient, skipped
        like torch). ``sparse_grads``: table -> (ids, rows [len(ids), dim]);
        duplicate ids are summed before sending. ``version``: the version the
        gradients were computed from (default: this client's last pull).
        """
        dense_grads = dict(dense_grads or {})
        if dense_grads and any(l is None for l in self._layouts):
            self._fetch_layouts()
        known = {s[0] for l in self._layouts if l for s in l.specs}
        unknown = sorted(set(dense_grads) - known)
        if unknown:
            raise ValueError(f"gradients for unknown dense parameter(s) {unknown[:5]}; init_dense first")
        blocks: list[list[pb.SparseBlock]] = [[] for _ in range(self.num_ps)]
        for table, (ids, values) in (sparse_grads or {}).items():
            dim, dtype = self._table(table)
            flat = as_row_ids(ids, table)
            values = values.detach().cpu().reshape(len(flat), dim)
            uniq, inverse = np.unique(flat, return_inverse=True)
            if len(uniq) != len(flat):  # merge duplicates: the PS optimizer needs one gradient per row
                values = torch.zeros((len(uniq), dim), dtype=values.dtype).index_add_(
                    0, torch.from_numpy(inverse.reshape(-1)), values)
                flat = uniq
            owners = row_owners(flat, self.num_ps)
            per = max(1, self.chunk_bytes // (dim * values.element_size()))
            for i in range(self.num_ps):
                sel = np.nonzero(owners == i)[0]
                for a in range(0, len(sel), per):
                    s = sel[a: a + per]
                    v = values[torch.from_numpy(s)].contiguous()
                    blocks[i].append(pb.SparseBlock(table=table, ids=fpb.Tensor(
                        dtype="int64", shape=[len(s)], data=flat[s].tobytes()), values=fpb.Tensor(
                        dtype=str(v.dtype).removeprefix("torch."), shape=[len(s), dim], data=_raw(v).tobytes())))
        self._seq += 1
        seq, shift = self._seq, 0 if version is None else self.version - version

        def one(i: int):
            dense, absent = self._pack_dense(i, dense_grads) if dense_grads and self._layouts[i] else (b"", [])
            header = pb.PushHeader(client_id=self.client_id, seq=seq, base_version=self._versions[i] - shift,
                                   layout_id=self._layouts[i].layout_id if len(dense) else 0,
                                   dense_bytes=len(dense), absent=absent)

            def requests():
                yield pb.PushChunk(header=header)
                for piece in _pieces(dense, self.chunk_bytes):
                    yield pb.PushChunk(dense=piece)
                for block in blocks[i]:
                    yield pb.PushChunk(sparse=block)
            return self._call(i, "PushGradients", lambda s, t: s.PushGradients(requests(), timeout=t),
                              nbytes=len(dense) + sum(b.ByteSize() for b in blocks[i]))

        results = self._fanout(one)
        versions = tuple(r.version for r in results)
        return PushResult(all(r.accepted for r in results), max(versions), versions,
                          any(r.applied for r in results), tuple(r.message for r in results))

    def _fetch_layouts(self) -> None:
        for i, info in enumerate(self.describe()):
            if info.dense_initialized:
                self._layouts[i] = _Layout.of(info.layout)

    def checkpoint(self) -> list[tuple[str, int]]:
        """Ask every PS to write a checkpoint now; (path, version) per PS."""
        res = self._fanout(lambda i: self._call(i, "Checkpoint", lambda s, t: s.Checkpoint(pb.CheckpointRequest(),
                                                                                          timeout=t)))
        return [(r.path, r.version) for r in res]

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for channel in self._channels:
            channel.close()
