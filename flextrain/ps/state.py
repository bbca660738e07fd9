"""The state of one PS shard and the rules that change it (no gRPC here).

Contracts:

* **version**: the number of optimizer updates this shard has applied (0
  after InitDense). SYNC mode applies one update per ``grads_to_wait``
  accepted pushes (their average); ASYNC mode one per push.
* **staleness**: a push names the version its gradients were computed from
  (``base_version``). SYNC rejects it when ``base < version - version_tolerance``;
  an accepted push counts towards the update being collected. ASYNC applies
  at once, optionally with ``lr / (1 + version - base)``, and rejects only
  beyond ``max_staleness`` (if > 0). A base above the version (a PS restored
  from an older checkpoint) is never stale.
* **exactly once per push**: ``(client_id, seq)`` of a client's latest push
  is remembered with its answer, so a retry of a push that was applied (and
  whose answer was lost) returns the same answer instead of applying twice.
* **exactly once per minibatch**: a push may name its minibatch (``step`` =
  task id, first and end record). Per task the shard remembers the end of
  the records it accepted; a push whose minibatch starts before that is a
  *duplicate*: answered accepted, nothing applied. So a task requeued after
  its worker died, or a minibatch recomputed because another PS rejected it
  as stale, is applied once on every shard, whichever worker pushes it.
  Accepted means applied or (SYNC) collected towards the next update.
  The bookkeeping is :mod:`flextrain.ps.exactly_once`; parsing, buffer reuse
  and SYNC accumulation of received gradients are :mod:`flextrain.ps.gradients`.
* **write-ahead log**: with ``wal`` set (:mod:`flextrain.ps.wal`), every
  state change (configure, init, tables, accepted push, flush) is queued for
  the log under the shard lock, in the order it is applied, and answered only
  once the log's writer thread has written it (group commit: the lock is not
  held while the disk is written, and one write carries every change queued
  meanwhile). So a restarted shard replays every change it acknowledged. Any
  answer (a retry, a duplicate, a rejection) waits for the log to hold
  everything queued before it, since it may depend on those changes. Pulls
  never wait for the log: they read the in-memory state, which may be ahead
  of the log by changes not yet acknowledged (a PS that dies then comes back
  without them, under a new incarnation, and their clients push them again).
* **thread safety**: one condition variable guards version, dense store,
  accumulator and config; each embedding table has its own lock (taken after
  the shard lock when both are needed), so row pulls never wait for a dense
  update. Received bytes are parsed before taking any lock.
* **incarnation**: random per process; clients use it to notice a restart.
"""

from __future__ import annotations

import contextlib
import random
import threading
from dataclasses import asdict, replace
from typing import Callable, Iterator

import torch

from flextrain.protocol.codec import RowBlock
from flextrain.ps.dense import DenseStore, Spec
from flextrain.ps.embedding import EmbeddingTable, TableSpec
from flextrain.ps.exactly_once import AcceptedPushes
from flextrain.ps.gradients import Accumulator, BufferPool, SparseGrads, parse_dense, parse_sparse
from flextrain.ps.optimizers import Optimizer, make_optimizer
from flextrain.ps.settings import PreconditionError, PushResult, SyncSettings

STATE_FORMAT = 1


class ShardState:
    """Dense parameters, embedding tables, optimizer and version of one PS shard."""

    def __init__(self, shard_index: int, num_ps: int, *, optimizer: Optimizer | None = None,
                 sync: SyncSettings | None = None) -> None:
        if not 0 <= shard_index < num_ps:
            raise ValueError(f"shard index {shard_index} is outside [0, {num_ps})")
        self.shard_index, self.num_ps = shard_index, num_ps
        self.incarnation = random.SystemRandom().getrandbits(63) | 1  # never 0: 0 means "unknown" on the wire
        self.optimizer = optimizer
        self.sync = (sync or SyncSettings()).validated()
        self.version = 0
        self.dense: DenseStore | None = None
        self.tables: dict[str, EmbeddingTable] = {}
        self.on_version: Callable[[int], None] | None = None  # called (outside the lock) after each update
        self._cond = threading.Condition()
        self._accepted = AcceptedPushes()
        self._pull_cache: tuple[int, int, list[bytes]] | None = None
        self._buffers = BufferPool()
        self.wal = None  # flextrain.ps.wal.WriteAheadLog, when the shard is durable
        self._acc = Accumulator(self._buffers)

    # ------------------------------------------------------------------ config

    def configure(self, *, optimizer: tuple[str, dict] | None = None, sync: SyncSettings | None = None,
                  num_ps: int = 0) -> tuple[Optimizer | None, SyncSettings, int]:
        """Set the optimizer (first writer wins) and/or the sync settings (any time)."""
        if num_ps and num_ps != self.num_ps:
            raise ValueError(f"the client expects {num_ps} PS but this is PS {self.shard_index} of {self.num_ps}")
        new_opt = make_optimizer(*optimizer) if optimizer else None  # ValueError for unknown names, first
        applied = False
        with self._cond:
            if new_opt is not None:
                if self.optimizer is None:
                    self.optimizer = new_opt
                elif (new_opt.name, new_opt.hyper) != (self.optimizer.name, self.optimizer.hyper):
                    raise PreconditionError(f"PS {self.shard_index} already runs {self.optimizer.describe()}; "
                                            f"it cannot switch to {new_opt.describe()}")
            if self.wal is not None:
                self.wal.log_configure(optimizer, sync)
            lsn = self._lsn()
            if sync is not None:
                self.sync = sync.validated()
                # Fewer workers now: the pushes already collected may complete an update.
                pending = self._acc.pending
                if self.sync.mode == "async" or (pending and pending >= self.sync.grads_to_wait):
                    applied = pending > 0 and self._apply_pending()
            result = (self.optimizer, self.sync, self.version)
        if applied:
            self._notify_version(result[2])
        self._logged(lsn)
        return result

    def info(self) -> dict:
        with self._cond:
            return {
                "shard_index": self.shard_index, "num_ps": self.num_ps, "version": self.version,
                "incarnation": self.incarnation, "dense": self.dense, "tables": [t.spec for t in self.tables.values()],
                "table_rows": {n: len(t) for n, t in self.tables.items()}, "optimizer": self.optimizer,
                "sync": self.sync, "pending": self._acc.pending,
            }

    # ------------------------------------------------------------------ init

    def init_dense(self, specs: list[Spec], data: bytearray) -> tuple[bool, int, DenseStore]:
        """Install the initial dense values unless already set; (set_now, version, store)."""
        with self._cond:
            done = self.dense is not None
            if done:
                result, lsn = (False, self.version, self.dense), self._lsn()
        if done:
            self._logged(lsn)
            return result
        store = DenseStore.from_stream(specs, data)  # built outside the lock: it copies every byte
        with self._cond:
            if self.dense is not None:  # another worker won the race meanwhile
                result = (False, self.version, self.dense)
            else:
                if self.wal is not None:
                    self.wal.log_init_dense(specs, data)
                self.dense = store
                self._pull_cache = None
                result = (True, self.version, store)
            lsn = self._lsn()
        self._logged(lsn)
        return result

    def declare_tables(self, specs: list[TableSpec]) -> list[TableSpec]:
        """Create the tables not yet known; a known table must be declared identically."""
        validated = [s.validated() for s in specs]
        with self._cond:
            for spec in validated:
                table = self.tables.get(spec.name)
                if table is not None and table.spec != spec:
                    raise ValueError(f"embedding table {spec.name!r} is already declared as {table.spec.to_dict()}; "
                                     f"cannot redeclare it as {spec.to_dict()}")
            new = [spec for spec in validated if spec.name not in self.tables]
            if new and self.wal is not None:
                self.wal.log_tables(new)
            for spec in new:
                self.tables[spec.name] = EmbeddingTable(spec)
            result, lsn = [t.spec for t in self.tables.values()], self._lsn()
        self._logged(lsn)
        return result

    def table(self, name: str) -> EmbeddingTable:
        table = self.tables.get(name)
        if table is None:
            raise ValueError(f"unknown embedding table {name!r} on PS {self.shard_index} "
                             f"(declared: {', '.join(sorted(self.tables)) or 'none'})")
        return table

    # ------------------------------------------------------------------ pull

    def pull_dense(self, known_version: int, known_incarnation: int, wait: float,
                   chunk_bytes: int) -> tuple[bool, int, DenseStore, list[bytes]]:
        """(unchanged, version, store, chunks); waits up to ``wait`` s for a newer version."""
        def current() -> bool:
            return known_version >= 0 and known_version == self.version and known_incarnation == self.incarnation

        with self._cond:
            if self.dense is None:
                raise PreconditionError(f"dense parameters are not initialised on PS {self.shard_index}; "
                                        f"call init_dense first")
            if wait > 0 and current():
                self._cond.wait_for(lambda: not current(), timeout=wait)
            if current():
                return True, self.version, self.dense, []
            cache = self._pull_cache
            if cache is None or cache[0] != self.version or cache[1] != chunk_bytes:
                # One copy per version, shared by every worker pulling it.
                cache = self._pull_cache = (self.version, chunk_bytes, self.dense.encoded_chunks(chunk_bytes))
            return False, self.version, self.dense, cache[2]

    def pull_row_blocks(self, table: str, ids, chunk_bytes: int) -> Iterator[tuple[torch.Tensor, int]]:
        """Rows for ``ids`` in blocks of at most ``chunk_bytes``, each with the version it was read at.

        SYNC mode reads all blocks at one instant; ASYNC mode block by block as they
        are sent (an update may land in between: ASYNC promises no more than that
        anyway, since an update can as well land between two pulls of one step).
        """
        t = self.table(table)
        per = max(1, chunk_bytes // (t.spec.dim * t.dtype.itemsize))
        for block in t.gather_blocks(ids, per, snapshot=self.sync.mode == "sync"):
            yield block, self.version

    # ------------------------------------------------------------------ push

    def receive_buffer(self, nbytes: int) -> bytearray:
        """A buffer for a push's dense bytes, recycled from earlier pushes when possible."""
        return self._buffers.take(nbytes)

    def push(self, *, client_id: str, seq: int, base_version: int, layout_id: int = 0,
             dense: bytearray | None = None, absent=(), sparse: list[RowBlock] = (),
             step: tuple[int, int, int] | None = None) -> PushResult:
        """Accept (or reject as stale) one worker's gradients; see the module docstring.

        ``step``: ``(task_id, start, end)`` of the minibatch, for exactly-once per minibatch.
        """
        if step is not None and not 0 <= step[1] < step[2]:
            raise ValueError(f"push names minibatch records [{step[1]}, {step[2]}) of task {step[0]}: not a range")
        grads, absent_set = parse_dense(self.dense, layout_id, dense, absent, shard_index=self.shard_index)
        merged = parse_sparse(sparse, self.table)
        with self._cond:
            if self.optimizer is None:
                raise PreconditionError(f"PS {self.shard_index} has no optimizer configured; call configure first")
            answered = self._accepted.answered(client_id, seq, self.version)
            if answered is not None:
                self._buffers.give_back(grads)
                result = answered
            else:
                result = self._admit(client_id, seq, base_version, step, grads, absent_set, merged, log=True)
            lsn = self._lsn()  # whatever the answer, it may rest on changes queued so far
        if result.applied and answered is None:
            self._notify_version(result.version)
        self._logged(lsn)  # answer only once the log holds them (group commit; the lock is free meanwhile)
        return result

    def _admit(self, client_id: str, seq: int, base: int, step, grads, absent: set[str], sparse: SparseGrads, *,
               log: bool) -> PushResult:
        """Dedupe by minibatch, judge staleness, log, apply; the caller holds the shard lock."""
        result = self._accepted.duplicate(step, self.version)
        if result is not None:
            self._buffers.give_back(grads)
        else:
            result = self._stale(base)
            if result is not None:
                self._buffers.give_back(grads)
            else:
                if log and self.wal is not None:
                    # Queued by reference: the buffer stays pinned (not recycled, not summed into)
                    # until the writer thread has written it.
                    self._buffers.pin(grads)
                    self.wal.log_push(client_id, seq, base, step, grads, absent, sparse,
                                      after=None if grads is None else lambda: self._buffers.unpin(grads))
                result = self._push_locked(base, grads, absent, sparse)
                if step is not None:
                    self._accepted.accept_step(step)
        self._accepted.answer(client_id, seq, result)
        return result

    def task_progress(self, task_ids) -> list[int]:
        """Per task id, the end of the records accepted for it (-1: none known)."""
        with self._cond:
            return [self._accepted.progress(int(t)) for t in task_ids]

    def flush(self, *, log: bool = True) -> tuple[bool, int]:
        """SYNC: apply what was collected even if fewer than ``grads_to_wait``; (applied, version)."""
        with self._cond:
            applied = self._acc.pending > 0
            if applied:
                if log and self.wal is not None:
                    self.wal.log_flush()
                self._apply_pending()
            version, lsn = self.version, self._lsn()
        if applied:
            self._notify_version(version)
        self._logged(lsn)
        return applied, version

    def _stale(self, base: int) -> PushResult | None:
        """The rejection of a push computed from version ``base``, or None when it is fresh enough."""
        s, version = self.sync, self.version
        if s.mode == "sync" and base < version - s.version_tolerance:
            return PushResult(False, version, f"stale gradient: computed from version {base}, PS "
                                              f"{self.shard_index} is at {version} (tolerance {s.version_tolerance})")
        staleness = max(0, version - base)
        if s.mode == "async" and s.max_staleness and staleness > s.max_staleness:
            return PushResult(False, version, f"stale gradient: {staleness} versions old, PS {self.shard_index} "
                                              f"accepts at most {s.max_staleness}")
        return None

    def _push_locked(self, base: int, grads, absent: set[str], sparse: SparseGrads) -> PushResult:
        """Collect or apply a push :meth:`_stale` accepted."""
        s, version = self.sync, self.version
        if s.mode == "sync":
            for spent in self._acc.add(grads, absent, sparse):
                self._buffers.give_back(spent)
            if self._acc.pending >= s.grads_to_wait:
                self._apply_pending()
                return PushResult(True, self.version, applied=True)
            return PushResult(True, version, f"{self._acc.pending}/{s.grads_to_wait} gradients collected")
        staleness = max(0, version - base)
        self._apply(grads, absent, sparse, 1, 1.0 / (1 + staleness) if s.staleness_lr else 1.0)
        self._buffers.give_back(grads)
        return PushResult(True, self.version, applied=True)

    def _apply_pending(self) -> bool:
        """SYNC: apply the collected pushes (their average) and start collecting anew."""
        acc = self._acc
        self._apply(acc.dense, acc.absent or set(), acc.sparse(), acc.pending, 1.0)
        self._buffers.give_back(acc.dense)
        self._acc = Accumulator(self._buffers)
        return True

    def _apply(self, grads, absent: set[str], sparse: SparseGrads, count: int, lr_scale: float) -> None:
        """Average ``count`` summed gradients and run the optimizer; bumps the version."""
        if grads is not None and self.dense is not None:
            if count > 1:
                for g in grads.groups:
                    g.div_(count)
            self.dense.apply(self.optimizer, grads, absent, lr_scale)
        for name, (ids, values) in sparse.items():
            self.tables[name].apply(self.optimizer, ids, values / count if count > 1 else values, lr_scale)
        self.version += 1
        self._pull_cache = None
        self._cond.notify_all()

    def _lsn(self) -> int:
        """The log position covering every change made so far (call under the shard lock; 0: no log)."""
        return self.wal.appended if self.wal is not None else 0

    def _logged(self, lsn: int) -> None:
        """Wait (outside the shard lock) until the log holds record ``lsn``: then a change may be answered."""
        if lsn and self.wal is not None:
            self.wal.wait(lsn)

    def _notify_version(self, version: int) -> None:
        if self.on_version is not None:
            self.on_version(version)

    # ------------------------------------------------------------------ checkpoint

    @contextlib.contextmanager
    def locked(self):
        """Hold every lock of the shard (state export/import)."""
        with self._cond, contextlib.ExitStack() as stack:
            for name in sorted(self.tables):
                stack.enter_context(self.tables[name].lock)
            yield

    def export_state(self) -> dict:
        """A statecodec tree of views (call inside :meth:`locked`). Pending SYNC pushes are not saved
        (the write-ahead log keeps them)."""
        return {
            "format": STATE_FORMAT, "shard_index": self.shard_index, "num_ps": self.num_ps, "version": self.version,
            "optimizer": None if self.optimizer is None else {"name": self.optimizer.name,
                                                              "hyper": dict(self.optimizer.hyper)},
            "sync": asdict(self.sync),
            "dense": None if self.dense is None else self.dense.state(),
            "tables": {name: t.state() for name, t in self.tables.items()},
            "tasks": torch.tensor(self._accepted.tasks(), dtype=torch.int64).reshape(-1, 2),
        }

    def load_state(self, tree: dict, *, keep_sync: SyncSettings | None = None) -> None:
        """Replace this shard's state with a checkpoint tree (the launcher's sync settings win if given)."""
        if tree.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported PS checkpoint format {tree.get('format')!r}")
        if (tree["shard_index"], tree["num_ps"]) != (self.shard_index, self.num_ps):
            raise ValueError(f"checkpoint is of PS {tree['shard_index']} of {tree['num_ps']}, "
                             f"not PS {self.shard_index} of {self.num_ps}")
        opt = tree["optimizer"]
        with self._cond:
            self.optimizer = make_optimizer(opt["name"], opt["hyper"]) if opt else self.optimizer
            self.sync = keep_sync or replace(SyncSettings(), **tree["sync"]).validated()
            self.dense = DenseStore.from_state(tree["dense"]) if tree["dense"] is not None else None
            self.tables = {name: EmbeddingTable.from_state(t) for name, t in tree["tables"].items()}
            self.version = int(tree["version"])
            self._acc = Accumulator(self._buffers)
            tasks = tree.get("tasks")  # absent in checkpoints written before exactly-once per minibatch
            self._accepted = AcceptedPushes(tasks.tolist() if tasks is not None else ())  # clients forgotten
            self._pull_cache = None
            self._cond.notify_all()
