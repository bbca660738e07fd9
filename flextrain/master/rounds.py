"""Rendezvous rounds of a job: workers join, rounds form, and a new round settles the last one.

A mixin of :class:`flextrain.master.coordinator.JobMaster` (as
:class:`flextrain.master.failures.FailureHandling` is): these methods run under
the master's lock and use its state (``rendezvous``, ``assigned``, ``ledger``,
``strategy``, ``checkpoints``). A round's members train in lockstep; when
membership changes, a new round forms at the next step boundary, and either
the most advanced survivor of the last round settles its tasks or, when none
survived, the job rolls back to its latest checkpoint.
"""

from __future__ import annotations

import time

from flextrain.master.accounting import most_advanced, settle_round
from flextrain.master.checkpoints import CheckpointError
from flextrain.master.phase import Phase
from flextrain.master.rendezvous import Round, RoundState, members_in_sync
from flextrain.proto import flextrain_pb2 as pb


class RoundKeeping:
    def join(self, worker_id: str, position: pb.Position, *, wait: float,
             exited=()) -> pb.JoinRendezvousResponse:
        """A worker joins the rendezvous and waits up to ``wait`` seconds for its round (a thread
        blocks on the condition; the asyncio server uses :meth:`join_enter` and :meth:`join_poll`)."""
        with self.cond:
            self.join_enter(worker_id, position, exited=exited)
            deadline = self.clock() + wait
            while True:
                resp = self.join_poll(worker_id)
                if resp is not None:
                    return resp
                left = deadline - self.clock()
                if left <= 0:
                    return pb.JoinRendezvousResponse(action=pb.JoinRendezvousResponse.WAIT)
                self.cond.wait(min(left, 0.05))  # time-based readiness (straggler timeout)

    def join_enter(self, worker_id: str, position: pb.Position, *, exited=()) -> None:
        """The first half of a join: the worker is waiting for a round (unless the round formed while
        it re-asked after a WAIT is already its own). ``exited``: peers it saw exiting
        (``JoinRendezvousRequest.exited_peers``)."""
        with self.cond:
            self._touch(worker_id, position)
            for peer in exited:
                self._peer_exited(peer, seen_by=worker_id)
            rnd = self.rendezvous.current
            placed = self.assigned.get(worker_id)
            if placed is not None and placed is rnd and rnd.state is not RoundState.CLOSED \
                    and position.round_id != rnd.round_id:
                return  # re-asking after a WAIT: the round formed meanwhile is its own
            self.assigned.pop(worker_id, None)
            if self.over or self.stopping or worker_id in self.retiring:
                return  # told to stop (join_poll): no round waits for it, and none ends for it
            if rnd is not None and rnd.state is RoundState.ACTIVE and worker_id in rnd.members:
                self.lost_at = self.lost_at or self.clock()  # a member back unasked: its collective failed
            self.rendezvous.join(worker_id, position, self.clock())
            if rnd is not None and rnd.state is RoundState.ACTIVE and worker_id not in rnd.members:
                self.rendezvous.request_end()  # a straggler: let it in at the next step boundary

    def _peer_exited(self, worker_id: str, *, seen_by: str) -> None:
        """A member saw ``worker_id``, a peer of its current round, exiting (its main thread is gone:
        flextrain/worker/peerwatch.py). It leaves the rendezvous now, so the round of the survivors
        forms as soon as they have joined; the launcher's report of the exit (``worker_exited``:
        relaunch, failure accounting) comes when the kernel has torn the process down."""
        rnd = self.rendezvous.current
        if worker_id not in self.alive or rnd is None or worker_id not in rnd.members or seen_by not in rnd.members:
            return  # gone already, or not a peer the reporter shares a round with
        if rnd.state is not RoundState.CLOSED and worker_id not in self.retiring:
            self.lost_at = self.lost_at or self.clock()
        self.alive.discard(worker_id)
        self.rendezvous.drop(worker_id)
        self.assigned.pop(worker_id, None)
        self.cond.notify_all()

    def join_poll(self, worker_id: str) -> pb.JoinRendezvousResponse | None:
        """The answer for a joined worker now (TRAIN or STOP), forming a round if one is due; None:
        no round for it yet. Cheap once its round formed: a long poll calls it at every change."""
        with self.cond:
            if self.over or self.stopping or worker_id in self.retiring:
                self.rendezvous.drop_waiter(worker_id)
                self.dismissed.add(worker_id)
                return pb.JoinRendezvousResponse(action=pb.JoinRendezvousResponse.STOP, message=self.message)
            if worker_id not in self.assigned:
                self.form_round()
            rnd = self.assigned.get(worker_id)
            if rnd is None:
                return None
            return pb.JoinRendezvousResponse(
                action=pb.JoinRendezvousResponse.TRAIN, round_id=rnd.round_id,
                rank=rnd.rank_of(worker_id), world_size=rnd.world_size,
                store_host=self.store_host, store_port=rnd.store_port or self.store_port,
                version=rnd.version,
                restore_checkpoint=rnd.restore_checkpoint,
                max_micro_batch=rnd.max_micro_batch,
                members_in_sync=rnd.members_in_sync,
                first_task=rnd.first_task,
            )

    def joins_answered(self, worker_ids) -> list[str]:
        """Of ``worker_ids`` (long polls waiting), those :meth:`join_poll` now answers, after forming
        a round if one is due: what a change wakes, instead of every waiting poll."""
        with self.cond:
            if self.over or self.stopping:
                return list(worker_ids)
            self.form_round()
            return [w for w in worker_ids if w in self.assigned or w in self.retiring]

    def rendezvous_due_in(self) -> float | None:
        """Seconds until waiting alone makes a round due (the straggler timeout); None: only a change can."""
        with self.cond:
            due = self.rendezvous.due_at()
            return None if due is None else max(0.0, due - self.clock())

    def form_round(self) -> None:
        # The first round waits for every worker started; later ones only for
        # registered workers: a newcomer still importing torch must not stall
        # the survivors of a failure (it joins at a later step boundary).
        launched = self.launched if self.rounds_formed == 0 else frozenset()
        if not self.rendezvous.ready(self.alive, self.clock(), launched=launched):
            return
        previous = self.rendezvous.current
        rnd, waiters = self.rendezvous.form(previous_round=previous.round_id if previous else None)
        self.strategy.round_formed(self, rnd, previous, waiters)
        rnd.members_in_sync = members_in_sync(rnd, previous, waiters)  # after a rollback's restore is known
        self.short_since = None
        last_m = self.micro_batches.current
        rnd.max_micro_batch, why = self.micro_batches.for_round(rnd.members)
        if self.micro_batches.auto and (previous is None or rnd.max_micro_batch != last_m):
            self.note(f"round {rnd.round_id}: max micro-batch {rnd.max_micro_batch} ({why}; --max-micro-batch auto)")
        self.round_history.append({
            "round": rnd.round_id, "version": rnd.version, "time": round(time.time(), 3),
            "members": [{"id": m, "pid": self.workers[m].pid if m in self.workers else 0} for m in rnd.members],
            "maxMicroBatch": rnd.max_micro_batch, "membersInSync": rnd.members_in_sync,
            **self._timings(rnd, previous),
        })
        for wid in rnd.members:
            self.assigned[wid] = rnd
        self.rounds_formed += 1
        if self.phase is Phase.PENDING:
            self.phase = Phase.RUNNING
        self.cond.notify_all()

    def _timings(self, rnd: Round, previous: Round | None) -> dict:
        """A new round's join times (newcomers to a running job: from their launch) and recovery time (from
        the master learning that a member was lost), for roundHistory and the metrics' histograms."""
        now, out = self.clock(), {}
        if previous is not None:
            joins = {m: round(now - self.launched_at[m], 4) for m in rnd.members
                     if m not in previous.members and m in self.launched_at}
            if joins:
                out["joinSeconds"] = joins
        if self.lost_at is not None:
            out["recoverySeconds"], self.lost_at = round(now - self.lost_at, 4), None
        return out

    def settle(self, rnd: Round, previous: Round | None, waiters) -> None:
        """A new round of lockstep training: settle the previous round's tasks by its most advanced
        survivor, or roll back when none survived (``TrainingStrategy.round_formed``'s default)."""
        if previous is None:
            rnd.restore_checkpoint = self.restore_checkpoint
            if rnd.restore_checkpoint:  # rank 0 loads it: the round starts at its version (the resume's)
                rnd.version = self.step
        elif (best := most_advanced((w.position for w in waiters), previous.round_id)) is not None:
            settle_round(self.ledger, previous, best)
            self.check_outcome()
        else:
            self._rollback(rnd)
        # The round's first task starts at its version: a batch schedule's G is taken from there.
        self.ledger.next_step = rnd.version

    def _rollback(self, rnd: Round) -> None:
        """No member of the last round survived: its model state is gone.

        Go back to the latest checkpoint (or the very start) for both the model
        and the ledger, so what was applied since is applied again exactly once.
        """
        latest = None
        self.flush_flash()  # the newest in-memory snapshot first: at most --memory-checkpoint-steps are redone
        if self.checkpoints is not None:
            try:  # the newest checkpoint that passes its checks; damaged ones are named and skipped
                latest, damaged = self.checkpoints.resume_point(check=self.ledger.check_state)
            except CheckpointError as exc:
                self.finish(Phase.FAILED, f"no worker of the last round survived and {exc}")
                return
            if damaged and latest is not None:
                self.note(f"damaged checkpoint state skipped: {'; '.join(damaged)}; using {latest['checkpoint']} "
                          f"(step {latest['version']})")
        self.ledger.restore(latest["ledger"] if latest else self.initial_ledger)
        self.evaluations.forget_unfinished()  # the restore dropped their tasks
        rnd.restore_checkpoint = latest["checkpoint"] if latest else ""
        rnd.version = latest["version"] if latest else 0
        where = f"checkpoint {latest['checkpoint']}" if latest else "the start (no checkpoint yet)"
        self.events.append(f"round {rnd.round_id}: no worker of the last round survived; resuming from {where}")
        self.message = self.events[-1]


__all__ = ["RoundKeeping"]
