"""The training strategy: what differs between AllReduce and ParameterServer training on the master.

:class:`~flextrain.master.coordinator.JobMaster` owns what every job shares (workers,
phase, evaluation, failures, checkpoint records) and calls its strategy for the
rest; it never asks which strategy it has. Implementations:
:class:`flextrain.master.lockstep.AllReduceStrategy` (rounds of lockstep workers
that answer task hand-outs alike) and :class:`flextrain.master.ps_tasks.ParameterServerStrategy`
(independent workers pushing to parameter servers). A third strategy (e.g. local
SGD) is one more module implementing this interface.

Every method is called with ``job.cond`` held, except :meth:`restore`, :meth:`save`
and :meth:`close`, which the master's main thread calls before the job runs,
every status period and at the end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable

from flextrain.proto import flextrain_pb2 as pb

if TYPE_CHECKING:
    from flextrain.master.checkpoints import CheckpointStore
    from flextrain.master.coordinator import JobMaster
    from flextrain.master.rendezvous import Round


class TrainingStrategy(ABC):
    @abstractmethod
    def training_task(self, job: JobMaster, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        """Answer a worker's ask for a training task."""

    @abstractmethod
    def evaluation_task(self, job: JobMaster, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        """Answer a worker's ask for an evaluation task (of the model it holds)."""

    @abstractmethod
    def worker_left(self, job: JobMaster, worker_id: str) -> None:
        """A worker exited: give its unfinished work back to the ledger."""

    def training_finished(self, job: JobMaster) -> bool:
        """Whether training is over (every epoch's tasks done, or a script job's scripts ended)."""
        return job.ledger.training_finished()

    def round_formed(self, job: JobMaster, rnd: Round, previous: Round | None, waiters: list) -> None:
        """A rendezvous round formed (``previous``: the one before it): settle the previous round's
        work. Lockstep training settles the ledger by the most advanced survivor (``JobMaster.settle``)."""
        job.settle(rnd, previous, waiters)

    def stops_at_once(self, job: JobMaster) -> bool:
        """Whether a stop request ends the job now (no stop checkpoint to wait for)."""
        return False

    def tick(self, job: JobMaster) -> None:
        """Time-driven work of the strategy (the master's main loop, about every second)."""

    @abstractmethod
    def restore(self, job: JobMaster, store: CheckpointStore, *,
                relocate: Callable[[dict], dict]) -> str | None:
        """Take over a resumed job's saved state; None, or why the job cannot resume.
        ``relocate`` re-roots a moved job directory's ledger state (flextrain/master/resume.py)."""

    def save(self, job: JobMaster) -> None:
        """Persist what a resume needs that checkpoints do not record (every status period)."""

    def close(self, job: JobMaster) -> None:
        """The job is over: a last :meth:`save` where there is one."""
        self.save(job)


__all__ = ["TrainingStrategy"]
