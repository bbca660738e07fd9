"""Script jobs on the master: rounds of the user's own script, no tasks handed out.

A script job (``flextrain run SCRIPT``, ElasticJob ``spec.script``) keeps
everything a module job's master owns — membership, rendezvous rounds, the
relaunch budget, failures, ``status.json``, Scale/Stop — and hands out no data:
the script reads its own. Each worker is an agent
(``flextrain/worker/script_agent.py``) that joins the rendezvous and runs the
script as a child process in the round's world, as torchrun's agent does.

What a round fixes: its members in rank order (world size, ranks) and a
TCPStore of its own that the round's scripts rendezvous through
(``MASTER_ADDR``/``MASTER_PORT``). A fresh store per round, on a fresh port, is
what keeps a stale script of an older round out of the new group: it can only
reach a store that is gone. The previous round's store is dropped when the
next one forms.

Rounds end as for module jobs (``JobMaster``): a member exits (the round is
closed), a worker registers or is scaled away (the round is closing). Agents
learn it from their heartbeat and restart their script in the next round;
the script continues from the last state it committed
(``flextrain.elastic.state.State``).

An agent whose script exited 0 asks for a training task: that ask records
its script as finished in its round and is answered NO_MORE once the
scripts of every member of the round finished (the job succeeded), WAIT
until then, END_ROUND when the round ended meanwhile (the script runs again
in the next round, from its last commit).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from flextrain.master.rendezvous import Round, RoundState
from flextrain.master.strategy import TrainingStrategy
from flextrain.proto import flextrain_pb2 as pb

if TYPE_CHECKING:
    from flextrain.master.checkpoints import CheckpointStore
    from flextrain.master.coordinator import JobMaster

log = logging.getLogger(__name__)

STATE_DIR = "state"  # under the job directory: where flextrain.elastic.state.State commits
STORE_TIMEOUT = timedelta(seconds=300)  # how long a script's store client waits for its peers


class ScriptStrategy(TrainingStrategy):
    """Rounds of script processes (see the module docstring); every method runs under ``job.cond``."""

    def __init__(self) -> None:
        self.done = False  # the scripts of every member of a round finished
        self.finished: dict[int, set[str]] = {}  # round id -> members whose script exited 0 in it
        self._stores: dict[int, object] = {}  # round id -> its TCPStore (the current round's only)

    def training_finished(self, job: JobMaster) -> bool:
        return self.done

    def round_formed(self, job: JobMaster, rnd: Round, previous: Round | None, waiters: list) -> None:
        from flextrain.master.stores import open_store  # torch: the master imports it anyway (its own store)

        # Dropping the previous round's store disconnects what is left of that round's scripts.
        self._stores.clear()
        store = open_store(job.store_bind, STORE_TIMEOUT)  # where the job's own store listens
        self._stores[rnd.round_id] = store
        rnd.store_port = store.port
        if previous is not None:
            job.note(f"round {rnd.round_id}: the script restarts on {rnd.world_size} worker(s) "
                     "from its last committed state")

    def training_task(self, job: JobMaster, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        """An agent's script exited 0 in round ``req.round_id`` (see the module docstring)."""
        if job.over:
            return pb.GetTaskResponse(action=pb.GetTaskResponse.NO_MORE if self.done else pb.GetTaskResponse.STOP,
                                      message=job.message)
        rnd = job.assigned.get(req.worker_id)
        if rnd is None or rnd.round_id != req.round_id or rnd.state is RoundState.CLOSED:
            return pb.GetTaskResponse(action=pb.GetTaskResponse.END_ROUND)
        finished = self.finished.setdefault(rnd.round_id, set())
        finished.add(req.worker_id)
        if not finished >= set(rnd.members):
            return pb.GetTaskResponse(action=pb.GetTaskResponse.WAIT)
        self.done = True
        job.final_checkpoint = str(Path(job.spec.job_dir) / STATE_DIR)  # what the script committed
        job.finish(type(job.phase).SUCCEEDED, f"the script finished on all {rnd.world_size} worker(s) of round "
                                        f"{rnd.round_id}")
        return pb.GetTaskResponse(action=pb.GetTaskResponse.NO_MORE, message=job.message)

    def evaluation_task(self, job: JobMaster, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        return pb.GetTaskResponse(action=pb.GetTaskResponse.NO_MORE)  # a script evaluates by itself

    def worker_left(self, job: JobMaster, worker_id: str) -> None:
        pass  # no tasks to give back: the script's state is what it committed

    def stops_at_once(self, job: JobMaster) -> bool:
        return True  # a script cannot be asked for a checkpoint; its last commit is what a resume uses

    def tick(self, job: JobMaster) -> None:
        job.form_round()  # a round may be due by time alone (the straggler timeout)

    def restore(self, job: JobMaster, store: CheckpointStore, *, relocate: Callable[[dict], dict]) -> str | None:
        """Nothing to restore on the master: the script restores its own committed state."""
        job.note("resuming: the script continues from its last committed state, if any")
        return None

    def close(self, job: JobMaster) -> None:
        self._stores.clear()


__all__ = ["STATE_DIR", "ScriptStrategy"]
