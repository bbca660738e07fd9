"""The collective layer: one process group per rendezvous round.

All rounds of a job share the master's long-lived TCPStore; round ``r`` uses
the key prefix ``round-r/`` over it, so forming the group of a new round is
a few store round-trips (milliseconds) and keys of dead rounds never collide
with live ones. gloo on CPU; nccl when CUDA is present.

Any failure inside a collective (a peer died, a timeout) surfaces as
:class:`CollectiveError`: the caller leaves the round and re-joins the
rendezvous; the process itself carries on. The group is torn down *before*
the error is raised: closing our connections makes every peer still blocked
on us fail at once too, instead of waiting out the collective timeout.

Asynchronous sums (:meth:`Collective.start_sum`) are owned by the collective,
never by its callers: a gloo group's connections close only when its last work
object is gone (``destroy_process_group`` and ``ProcessGroup.abort`` leave them
open while a work lives), so a work kept anywhere after a failure would leave a
surviving peer blocked on us until its timeout or a later round.
"""


from __future__ import annotations

from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout  # public API has no way to raise it later


class CollectiveError(RuntimeError):
    pass


FORM_TIMEOUT = timedelta(seconds=15)


class Collective:
    def __init__(self, *, timeout: float = 60.0) -> None:
        self.timeout = timedelta(seconds=timeout)
        self._store: dist.TCPStore | None = None
        self._address: tuple[str, int] | None = None
        self.round_id = -1
        self.rank = 0
        self.world_size = 1
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self._inflight: list = []  # works of start_sum not waited for yet (the only references to them)

    def join_round(self, *, host: str, port: int, round_id: int, rank: int, world_size: int) -> None:
        self.leave()
        if self._store is None or self._address != (host, port):
            self._store = dist.TCPStore(host, port, is_master=False, timeout=self.timeout)
            self._address = (host, port)
        self.round_id, self.rank, self.world_size = round_id, rank, world_size
        if world_size == 1:
            return  # a world of one needs no group: reductions are identities
        prefix = dist.PrefixStore(f"round-{round_id}/", self._store)
        try:
            # Every member got its TRAIN answer within milliseconds of the others: a member that has
            # not arrived within FORM_TIMEOUT died in between, and waiting the full timeout for it
            # would stall the survivors (a dead peer cannot break a connection it never opened).
            dist.init_process_group(self.backend, store=prefix, rank=rank, world_size=world_size,
                                    timeout=min(self.timeout, FORM_TIMEOUT))
            _set_pg_timeout(self.timeout, None)  # a step may legitimately wait on a slow peer that long
        except Exception as exc:  # a member died while the group formed
            self.leave()
            raise CollectiveError(f"forming round {round_id} failed: {exc}") from exc

    def leave(self) -> None:
        self._inflight.clear()  # first: the group's connections close once no work of it is left
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a broken group may fail to tear down; it is dropped either way
                pass

    def all_reduce_sum(self, tensors: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Sum ``tensors`` (one, or several of any dtypes gloo sums: float64/32, bfloat16, float16,
        integers) across the round, in place, each in its own dtype. Several are all in flight at
        once and waited for together, so a model of mixed dtypes pays about one round trip."""
        if self.world_size == 1:
            return
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        try:
            if len(tensors) == 1:
                dist.all_reduce(tensors[0], op=dist.ReduceOp.SUM)
            else:
                for work in [dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True) for t in tensors]:
                    work.wait()
        except Exception as exc:
            self.leave()
            raise CollectiveError(f"all_reduce in round {self.round_id} failed: {exc}") from exc

    def start_sum(self, tensor: torch.Tensor) -> None:
        """Start summing ``tensor`` across the round, in place, asynchronously; :meth:`wait_all`
        waits for it. Every rank must start the same sums in the same order."""
        try:
            self._inflight.append(dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True))
        except Exception as exc:
            self.leave()
            raise CollectiveError(f"all_reduce in round {self.round_id} failed: {exc}") from exc

    def wait_all(self) -> None:
        """Wait for every sum started, in order; a failure of any (a peer died with them in flight)
        drops them all, tears the group down and raises :class:`CollectiveError`."""
        works, self._inflight = self._inflight, []
        try:
            while works:
                works.pop(0).wait()  # no name holds it: a failed work dies with the exception's frame
        except Exception as exc:
            works.clear()
            self.leave()
            raise CollectiveError(f"all_reduce in round {self.round_id} failed: {exc}") from exc

    def broadcast_bytes(self, data: bytes | None, *, src: int = 0) -> bytes:
        """Rank ``src`` sends ``data``; every rank returns it."""
        if self.world_size == 1:
            return data or b""
        try:
            size = torch.tensor([len(data) if self.rank == src else 0], dtype=torch.int64)
            dist.broadcast(size, src=src)
            if self.rank == src:
                buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            else:
                buf = torch.empty(int(size.item()), dtype=torch.uint8)
            dist.broadcast(buf, src=src)
        except Exception as exc:
            self.leave()
            raise CollectiveError(f"broadcast in round {self.round_id} failed: {exc}") from exc
        return data if self.rank == src else buf.numpy().tobytes()
