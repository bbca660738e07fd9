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
* **write-ahead log**: with ``wal`` set (:mod:`flextrain.ps.wal`), every
  state change (configure, init, tables, accepted push, flush) is appended
  under the shard lock before it is applied and before it is answered, so a
  restarted shard replays exactly what it acknowledged.
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
from collections import OrderedDict
from dataclasses import asdict, replace
from typing import Callable, Iterator

import numpy as np
import torch

from flextrain.ps.codec import RowBlock, concat_blocks, merge_rows
from flextrain.ps.dense import DenseStore, Spec
from flextrain.ps.embedding import EmbeddingTable, TableSpec
from flextrain.ps.optimizers import Optimizer, make_optimizer
from flextrain.ps.settings import PreconditionError, PushResult, SyncSettings
from flextrain.ps.shard import as_row_ids

STATE_FORMAT = 1
_DEDUPE_CLIENTS = 4096  # clients remembered for push de-duplication (LRU)
_SPARE_BUFFERS = 4      # received gradient buffers kept for reuse (fresh big buffers cost page faults)
_TASKS_REMEMBERED = 1 << 17  # tasks whose accepted minibatches are remembered (LRU; only recent ones matter)


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
        self._dedupe: OrderedDict[str, tuple[int, PushResult]] = OrderedDict()
        self._pull_cache: tuple[int, int, list[bytes]] | None = None
        self._spare: list[bytearray] = []
        self._spare_lock = threading.Lock()
        self._task_until: OrderedDict[int, int] = OrderedDict()  # task id -> end of the records accepted
        self.wal = None  # flextrain.ps.wal.WriteAheadLog, when the shard is durable
        self._reset_accumulator()

    def _reset_accumulator(self) -> None:
        self._pending = 0
        self._acc_dense = None           # DenseArena summing the pending dense gradients
        self._acc_absent: set[str] | None = None
        self._acc_sparse: dict[str, list[tuple[np.ndarray, torch.Tensor]]] = {}

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
            if sync is not None:
                self.sync = sync.validated()
                # Fewer workers now: the pushes already collected may complete an update.
                if self.sync.mode == "async" or (self._pending and self._pending >= self.sync.grads_to_wait):
                    applied = self._pending > 0 and self._apply_pending()
            result = (self.optimizer, self.sync, self.version)
        if applied:
            self._notify_version(result[2])
        return result

    def info(self) -> dict:
        with self._cond:
            return {
                "shard_index": self.shard_index, "num_ps": self.num_ps, "version": self.version,
                "incarnation": self.incarnation, "dense": self.dense, "tables": [t.spec for t in self.tables.values()],
                "table_rows": {n: len(t) for n, t in self.tables.items()}, "optimizer": self.optimizer,
                "sync": self.sync, "pending": self._pending,
            }

    # ------------------------------------------------------------------ init

    def init_dense(self, specs: list[Spec], data: bytearray) -> tuple[bool, int, DenseStore]:
        """Install the initial dense values unless already set; (set_now, version, store)."""
        with self._cond:
            if self.dense is not None:
                return False, self.version, self.dense
        store = DenseStore.from_stream(specs, data)  # built outside the lock: it copies every byte
        with self._cond:
            if self.dense is not None:  # another worker won the race meanwhile
                return False, self.version, self.dense
            if self.wal is not None:
                self.wal.log_init_dense(specs, data)
            self.dense = store
            self._pull_cache = None
            return True, self.version, store

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
            return [t.spec for t in self.tables.values()]

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
        with self._spare_lock:
            for i, buf in enumerate(self._spare):
                if len(buf) == nbytes:
                    return self._spare.pop(i)
        return bytearray(nbytes)

    def _release(self, grads) -> None:
        if grads is not None and grads.owner is not None:
            with self._spare_lock:
                if len(self._spare) < _SPARE_BUFFERS:
                    self._spare.append(grads.owner)

    def push(self, *, client_id: str, seq: int, base_version: int, layout_id: int = 0,
             dense: bytearray | None = None, absent=(), sparse: list[RowBlock] = (),
             step: tuple[int, int, int] | None = None) -> PushResult:
        """Accept (or reject as stale) one worker's gradients; see the module docstring.

        ``step``: ``(task_id, start, end)`` of the minibatch, for exactly-once per minibatch.
        """
        if step is not None and not 0 <= step[1] < step[2]:
            raise ValueError(f"push names minibatch records [{step[1]}, {step[2]}) of task {step[0]}: not a range")
        grads, absent_set = self._parse_dense(layout_id, dense, absent)
        merged = self._parse_sparse(sparse)
        with self._cond:
            if self.optimizer is None:
                raise PreconditionError(f"PS {self.shard_index} has no optimizer configured; call configure first")
            if client_id:
                last = self._dedupe.get(client_id)
                if last is not None and seq <= last[0]:
                    self._release(grads)
                    if seq == last[0]:
                        return last[1]  # a retry of a push already handled
                    return PushResult(False, self.version, f"push {seq} of client {client_id} is older than its "
                                                           f"latest push {last[0]}")
            result = self._admit(client_id, seq, base_version, step, grads, absent_set, merged, log=True)
        if result.applied:
            self._notify_version(result.version)
        return result

    def _admit(self, client_id: str, seq: int, base: int, step, grads, absent: set[str], sparse: dict, *,
               log: bool) -> PushResult:
        """Dedupe by minibatch, judge staleness, log, apply; the caller holds the shard lock."""
        until = self._task_until.get(step[0]) if step is not None else None
        if until is not None and step[1] < until:
            self._release(grads)
            result = PushResult(True, self.version, f"records [{step[1]}, {step[2]}) of task {step[0]} were "
                                                    f"already accepted", duplicate=True)
        else:
            result = self._stale(base)
            if result is not None:
                self._release(grads)
            else:
                if log and self.wal is not None:  # before applying: applying may reuse the gradient buffers
                    self.wal.log_push(client_id, seq, base, step, grads, absent, sparse)
                result = self._push_locked(base, grads, absent, sparse)
                if step is not None:
                    self._task_until[step[0]] = step[2]
                    self._task_until.move_to_end(step[0])
                    if len(self._task_until) > _TASKS_REMEMBERED:
                        self._task_until.popitem(last=False)
        if client_id:
            self._dedupe[client_id] = (seq, result)
            self._dedupe.move_to_end(client_id)
            if len(self._dedupe) > _DEDUPE_CLIENTS:
                self._dedupe.popitem(last=False)
        return result

    def task_progress(self, task_ids) -> list[int]:
        """Per task id, the end of the records accepted for it (-1: none known)."""
        with self._cond:
            return [self._task_until.get(int(t), -1) for t in task_ids]

    def flush(self, *, log: bool = True) -> tuple[bool, int]:
        """SYNC: apply what was collected even if fewer than ``grads_to_wait``; (applied, version)."""
        with self._cond:
            applied = self._pending > 0
            if applied:
                if log and self.wal is not None:
                    self.wal.log_flush()
                self._apply_pending()
            version = self.version
        if applied:
            self._notify_version(version)
        return applied, version

    def _parse_dense(self, layout_id: int, dense: bytearray | None, absent) -> tuple[object, set[str]]:
        store = self.dense
        if dense is None:
            return None, {s.name for s in store.layout} if store else set()
        if store is None:
            raise PreconditionError(f"dense parameters are not initialised on PS {self.shard_index}; "
                                    f"call init_dense first")
        if layout_id != store.layout_id or len(dense) != store.total_bytes:
            raise ValueError(f"dense gradients do not match the layout of PS {self.shard_index} (layout id "
                             f"{layout_id} vs {store.layout_id}, {len(dense)} vs {store.total_bytes} bytes); "
                             f"pull the parameters again")
        absent_set = set(absent)
        unknown = absent_set - {s.name for s in store.layout}
        if unknown:
            raise ValueError(f"unknown dense parameter(s) {sorted(unknown)} on PS {self.shard_index}")
        grads = store.wrap(dense)
        store.zero(grads, absent_set)
        return grads, absent_set

    def _parse_sparse(self, sparse: list[RowBlock]) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
        """Per table, (unique ids, summed gradient rows): validated, one copy of the received bytes."""
        blocks: dict[str, list[RowBlock]] = {}
        for block in sparse:
            table = self.table(block.table)
            if block.dim != table.spec.dim:
                raise ValueError(f"embedding table {block.table!r}: gradient rows of width {block.dim}, "
                                 f"the table's dim is {table.spec.dim}")
            blocks.setdefault(block.table, []).append(block)
        merged = {}
        for name, parts in blocks.items():
            ids, values = concat_blocks(parts, self.tables[name].dtype)
            merged[name] = merge_rows(as_row_ids(ids, name), values)
        return merged

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

    def _push_locked(self, base: int, grads, absent: set[str], sparse: dict) -> PushResult:
        """Collect or apply a push :meth:`_stale` accepted."""
        s, version = self.sync, self.version
        if s.mode == "sync":
            self._accumulate(grads, absent, sparse)
            if self._pending >= s.grads_to_wait:
                self._apply_pending()
                return PushResult(True, self.version, applied=True)
            return PushResult(True, version, f"{self._pending}/{s.grads_to_wait} gradients collected")
        staleness = max(0, version - base)
        self._apply(grads, absent, sparse, 1, 1.0 / (1 + staleness) if s.staleness_lr else 1.0)
        self._release(grads)
        return PushResult(True, self.version, applied=True)

    def _accumulate(self, grads, absent: set[str], sparse: dict) -> None:
        if grads is not None:
            if self._acc_dense is None:
                self._acc_dense = grads  # the received buffer is ours: sum into it, no copy
            else:
                for acc, g in zip(self._acc_dense.groups, grads.groups):
                    acc.add_(g)
                self._release(grads)
        self._acc_absent = absent if self._acc_absent is None else self._acc_absent & absent
        for name, block in sparse.items():
            self._acc_sparse.setdefault(name, []).append(block)
        self._pending += 1

    def _apply_pending(self) -> bool:
        n = self._pending
        sparse = {}
        for name, blocks in self._acc_sparse.items():
            if len(blocks) == 1:  # already merged on arrival
                sparse[name] = blocks[0]
            else:
                sparse[name] = merge_rows(np.concatenate([b[0] for b in blocks]), torch.cat([b[1] for b in blocks]))
        self._apply(self._acc_dense, self._acc_absent or set(), sparse, n, 1.0)
        self._release(self._acc_dense)
        self._reset_accumulator()
        return True

    def _apply(self, grads, absent: set[str], sparse: dict, count: int, lr_scale: float) -> None:
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
            "tasks": torch.tensor(list(self._task_until.items()), dtype=torch.int64).reshape(-1, 2),
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
            self._reset_accumulator()
            self._dedupe.clear()
            tasks = tree.get("tasks")  # absent in checkpoints written before exactly-once per minibatch
            self._task_until = OrderedDict((int(t), int(u)) for t, u in tasks.tolist()) if tasks is not None \
                else OrderedDict()
            self._pull_cache = None
            self._cond.notify_all()
