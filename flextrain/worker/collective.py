"""The collective layer: one process group per rendezvous round.

All rounds of a job share the master's long-lived TCPStore; round ``r`` uses
the key prefix ``round-r/`` over it, so forming the group of a new round is
a few store round-trips (milliseconds) and keys of dead rounds never collide
with live ones. gloo on CPU; nccl when CUDA is present.

Any failure inside a collective (a peer died, a timeout) surfaces as
:class:`CollectiveError`: the caller leaves the round and re-joins the
rendezvous; the process itself carries on. The group is left *before* the
error is raised, and its teardown runs on a thread of its own: gloo's
destructor waits for its event loop to tick once per connection (10-20 ms
here), which would otherwise sit between the failure and the worker's join of
the next round. Tearing it down closes our connections, so every peer still
blocked on us fails too, instead of waiting out the collective timeout. The
error is raised with no traceback of the failed call attached (its frames hold
the group; freeing them must not run the teardown on the training thread).

Asynchronous sums (:meth:`Collective.start_sum`) are owned by the collective,
never by its callers: a gloo group's connections close only when its last work
object is gone (``destroy_process_group`` and ``ProcessGroup.abort`` leave them
open while a work lives), so a work kept anywhere after a failure would leave a
surviving peer blocked on us until its timeout or a later round. Leaving hands
the works still in flight to the teardown thread with the group.

With a :class:`~flextrain.worker.peerwatch.PeerWatch` (``watch``), a peer whose process exits is
seen before its sockets close (robust futexes): :meth:`peer_exited` then shuts down the current
group's connections (the sockets gloo opened while the group formed; never its listener, whose
shutdown aborts gloo), so the collective in flight fails at once, on every survivor, the usual
way. Peers seen exiting are reported to the master with the next join (:meth:`take_exited`).
Every wait on a collective polls in :data:`WAIT_SLICE` slices and gives up as soon as the watch has
broken the round: a shut-down connection normally fails the pending call at once, but a gloo send
was seen to stay pending on a dead peer regardless (until the group's timeout, 60 s), and a member
stuck there would miss the survivors' next round.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout  # public API has no way to raise it later


class CollectiveError(RuntimeError):
    pass


FORM_TIMEOUT = timedelta(seconds=15)
WAIT_SLICE = timedelta(milliseconds=50)  # how often a wait on a collective looks at the peer watch
_TIMED_OUT = "Operation timed out!"  # Work.wait(timeout)'s error: the work goes on, nothing failed
# broadcast_bytes: the bytes that travel with the length in its first collective (every member of a
# round runs the same code, so the same size). A task answer with a batch of tasks ahead fits.
BROADCAST_FRAME = 8192
_TEARDOWN = "flextrain-group-teardown"  # the threads that drop a left group (see _drop_in_background)
_gave_up = threading.Event()  # a wait gave up on a work that may still pend (its teardown waits for it)
_LENGTH = 8  # the length: one int64 (native byte order: the members share a machine type), as bytes


class Collective:
    def __init__(self, *, timeout: float = 60.0, watch=None) -> None:
        """``watch``: a :class:`~flextrain.worker.peerwatch.PeerWatch` whose ``on_exit`` is
        :meth:`peer_exited` (None: deaths are seen when sockets close)."""
        self.timeout = timedelta(seconds=timeout)
        self._store: dist.TCPStore | None = None
        self._address: tuple[str, int] | None = None
        self.round_id = -1
        self.rank = 0
        self.world_size = 1
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self._inflight: list = []  # works of start_sum not waited for yet (the only references to them)
        self._group = None  # the round's process group (start_sum calls it directly)
        self._sum = dist.AllreduceOptions()
        self._sum.reduceOp = dist.ReduceOp.SUM
        self.watch = watch
        self._lock = threading.Lock()  # the round's sockets vs a peer's exit seen on a watch thread
        self._sockets: dict[int, str] = {}  # the current group's sockets: fd -> "socket:[inode]"
        self._exited: list[str] = []  # peers of our rounds seen exiting, not reported to the master yet
        self.broken_by: str | None = None  # the peer whose exit broke the current group (in errors)

    def join_round(self, *, host: str, port: int, round_id: int, rank: int, world_size: int) -> None:
        self.leave()
        if self._store is None or self._address != (host, port):
            self._store = dist.TCPStore(host, port, is_master=False, timeout=self.timeout)
            self._address = (host, port)
        self.round_id, self.rank, self.world_size = round_id, rank, world_size
        if world_size == 1:
            return  # a world of one needs no group: reductions are identities
        prefix = dist.PrefixStore(f"round-{round_id}/", self._store)
        before = set(_sockets().values()) if self.watch is not None else None
        try:
            # Every member got its TRAIN answer within milliseconds of the others: a member that has
            # not arrived within FORM_TIMEOUT died in between, and waiting the full timeout for it
            # would stall the survivors (a dead peer cannot break a connection it never opened).
            dist.init_process_group(self.backend, store=prefix, rank=rank, world_size=world_size,
                                    timeout=min(self.timeout, FORM_TIMEOUT))
            _set_pg_timeout(self.timeout, None)  # a step may legitimately wait on a slow peer that long
            self._group = dist.distributed_c10d._get_default_group()
            if before is not None:
                with self._lock:
                    self._sockets = {fd: link for fd, link in _sockets().items() if link not in before}
                self.watch.round(host=host, port=port, round_id=round_id, rank=rank, world_size=world_size)
            return
        except Exception as exc:  # a member died while the group formed
            error = f"forming round {round_id} failed: {exc}"
        self._failed(error)

    def leave(self) -> None:
        """Leave the round's group (if any); its teardown finishes in the background, with the works
        of :meth:`start_sum` still in flight (the group's connections close once none is left)."""
        works, self._inflight = self._inflight, []
        self._group = None
        with self._lock:  # from here a peer's exit no longer touches these sockets (closed by the teardown)
            self._sockets = {}
            self.broken_by = None
        if dist.is_initialized():
            # the only references left once destroyed: the group and its works
            box = [dist.distributed_c10d._get_default_group(), *works]
            works.clear()  # a failed wait_all's frame may still name this list
            try:
                dist.destroy_process_group()
            except Exception:  # a broken group may fail to tear down; it is dropped either way
                pass
            _drop_in_background(box)

    def peer_exited(self, worker_id: str, rounds: frozenset) -> None:
        """A watched peer's process is exiting (called on a watch thread); ``rounds``: those it was
        a member of. If the current round is one, break its group now."""
        with self._lock:
            self._exited.append(worker_id)
            if self.round_id not in rounds or not self._sockets:
                return
            self.broken_by = worker_id
            for fd, link in self._sockets.items():
                _shut_down(fd, link)

    def take_exited(self) -> list[str]:
        """The peers seen exiting since the last call (for the master: JoinRendezvousRequest.exited_peers)."""
        with self._lock:
            out, self._exited = self._exited, []
        return out

    def _failed(self, what: str) -> None:
        """Leave the broken round and raise :class:`CollectiveError` (called outside the ``except``
        block that caught the failure, so the failed call's frames are already freed)."""
        if self.broken_by is not None:
            what += f" ({self.broken_by}'s process exited: connections shut down)"
        self.leave()
        raise CollectiveError(what)

    def all_reduce_sum(self, tensors: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Sum ``tensors`` (one, or several of any dtypes gloo sums: float64/32, bfloat16, float16,
        integers) across the round, in place, each in its own dtype, and wait for every sum in flight.
        Several are in flight at once, so a model of mixed dtypes pays about one round trip."""
        if self.world_size == 1:
            return
        for tensor in [tensors] if isinstance(tensors, torch.Tensor) else tensors:
            self.start_sum(tensor)
        self.wait_all()

    def _wait(self, work) -> None:
        """Wait for ``work``; raise once the watch has broken the round, even if the work still pends
        (the group's teardown takes it). Without a watch, one plain wait."""
        if self.watch is None:
            work.wait()
            return
        while True:
            try:
                work.wait(WAIT_SLICE)
                return
            except RuntimeError as exc:
                if _TIMED_OUT not in str(exc):
                    raise
            if self.broken_by is not None:
                _gave_up.set()
                raise RuntimeError("the wait was given up: the round's connections were shut down")

    def start_sum(self, tensor: torch.Tensor) -> None:
        """Start summing ``tensor`` across the round, in place, asynchronously; :meth:`wait_all`
        waits for it. Every rank must start the same sums in the same order. (The group's own
        ``allreduce``, as DDP's reducer calls it: ``dist.all_reduce``'s Python checks and logging
        wrapper cost a few microseconds of every step's.)"""
        try:
            self._inflight.append(self._group.allreduce([tensor], self._sum))
            return
        except Exception as exc:
            error = f"all_reduce in round {self.round_id} failed: {exc}"
        self._failed(error)

    def wait_all(self) -> None:
        """Wait for every sum started, in order; a failure of any (a peer died with them in flight)
        tears the group down with the rest of them and raises :class:`CollectiveError`."""
        works = self._inflight
        try:
            while works:
                self._wait(works[0])
                works.pop(0)
            return
        except Exception as exc:
            error = f"all_reduce in round {self.round_id} failed: {exc}"
        self._failed(error)  # leave() takes what is left of works (the failed one too) to the teardown

    def broadcast_bytes(self, data: bytes | None, *, src: int = 0) -> bytes:
        """Rank ``src`` sends ``data``; every rank returns it. Up to :data:`BROADCAST_FRAME` bytes
        travel in one collective with their length (a round's task answer, at a task boundary: a
        second, for the length alone, would be another sync point of every member); the rest of a
        larger ``data`` (a state blob) in a second one."""
        if self.world_size == 1:
            return data or b""
        try:
            head = torch.zeros(_LENGTH + BROADCAST_FRAME, dtype=torch.uint8)
            if self.rank == src:
                head[:_LENGTH] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
                first = data[:BROADCAST_FRAME]
                if first:
                    head[_LENGTH:_LENGTH + len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
            self._wait(dist.broadcast(head, src=src, async_op=True))
            size = int(head[:_LENGTH].view(torch.int64).item())
            if size <= BROADCAST_FRAME:
                return data if self.rank == src else head[_LENGTH:_LENGTH + size].numpy().tobytes()
            if self.rank == src:
                rest = torch.frombuffer(bytearray(data[BROADCAST_FRAME:]), dtype=torch.uint8)
            else:
                rest = torch.empty(size - BROADCAST_FRAME, dtype=torch.uint8)
            self._wait(dist.broadcast(rest, src=src, async_op=True))
            return data if self.rank == src else head[_LENGTH:].numpy().tobytes() + rest.numpy().tobytes()
        except Exception as exc:
            error = f"broadcast in round {self.round_id} failed: {exc}"
        self._failed(error)


def _sockets() -> dict[int, str]:
    """This process's open sockets: fd -> ``socket:[inode]`` (~50 us for a worker's few dozen fds)."""
    out = {}
    with os.scandir("/proc/self/fd") as fds:
        for entry in fds:
            try:
                link = os.readlink(entry.path)
            except OSError:
                continue
            if link.startswith("socket:"):
                out[int(entry.name)] = link
    return out


def _shut_down(fd: int, link: str) -> None:
    """Shut down the connection on ``fd`` if it is still the socket ``link`` and connected (a
    listener has no peer: shutting it down aborts gloo)."""
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != link:
            return
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.getpeername()
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()  # the duplicate; gloo's own descriptor stays until its teardown


def _drop_in_background(box: list) -> None:
    """Drop the last reference to the group in ``box`` on a thread of its own: gloo's teardown
    (closing the connections, each waiting for a tick of its event loop) runs there, off the
    training thread (the destructor does not hold the GIL while it waits). Not a daemon: the
    interpreter's exit waits for it (killed mid-destructor, gloo aborts the process)."""
    threading.Thread(target=box.clear, name=_TEARDOWN).start()


def teardown_stuck() -> bool:
    """Whether this process gave up a wait on a collective whose work may still pend, and a group's
    teardown is still running: gloo's destructor then waits for that work until the group's timeout,
    and so would the interpreter's exit."""
    return _gave_up.is_set() and any(t.name == _TEARDOWN and t.is_alive() for t in threading.enumerate())


def exit_unless_torn_down(code: int) -> None:
    """Exit the process now with ``code`` if :func:`teardown_stuck`; else return (a normal exit
    follows). The Python exit handlers run (the alive mark is removed), the destructors do not: gloo's
    would wait on the given-up work, and stopping it mid-way aborts the process."""
    if not teardown_stuck():
        return
    logging.getLogger(__name__).info("exiting without waiting for a process group's teardown: a collective "
                                     "given up on may still pend until the group's timeout")
    atexit._run_exitfuncs()  # CPython's own exit handlers (our alive mark's removal among them)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
