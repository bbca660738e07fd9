"""The job's workers: launched, registered, heard from, hung, gone.

A mixin of :class:`flextrain.master.coordinator.JobMaster` (as
:class:`flextrain.master.rounds.RoundKeeping` is): these methods run under the
master's lock and keep its worker table (``workers``, ``launched``, ``alive``,
``retiring``) and what heartbeats carry (positions, losses, memory, traffic),
and find the workers that hang (``tick``, called by the master's main loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from flextrain.job import Strategy
from flextrain.master.accounting import commit_passed
from flextrain.master.failures import failed_message
from flextrain.master.health import Liveness, find_hung
from flextrain.master.phase import Phase
from flextrain.master.rendezvous import RoundState
from flextrain.master.stragglers import SlowWorker, judge_node_check, note_compute
from flextrain.proto import flextrain_pb2 as pb


@dataclass
class WorkerInfo:
    worker_id: str
    registered: float
    last_seen: float
    position: pb.Position
    loss: float | None = None  # latest reported training loss (NaN when it was NaN)
    samples: int = 0
    waiting_for_peers: bool = False
    stalled_seconds: float = 0.0
    pid: int = 0
    skipped_steps: int = 0  # steps it dropped as non-finite (--nan-policy skip-step)
    node: str = ""  # where it runs (the Kubernetes node, else the host), as it registered


def add_traffic(total: pb.PSTraffic, more: pb.PSTraffic) -> None:
    """Add a heartbeat's parameter-server calls to the job's sums (MergeFrom would replace, not add)."""
    for field in pb.PSTraffic.DESCRIPTOR.fields:
        setattr(total, field.name, getattr(total, field.name) + getattr(more, field.name))


class WorkerTable:
    # ---- membership (launch backend side) --------------------------------------
    def worker_launched(self, worker_id: str) -> None:
        with self.cond:
            self.launched.add(worker_id)
            self.launched_at[worker_id] = self.clock()
            self.cond.notify_all()

    def desired_changed(self, previous: int, desired: int) -> None:
        """The instance manager's desired count changed (a scale, a suspend, a resume)."""
        with self.cond:
            self.scales.append((self.clock(), previous, desired))

    def worker_exited(self, worker_id: str) -> None:
        with self.cond:
            rnd = self.rendezvous.current
            if (rnd is not None and rnd.state is not RoundState.CLOSED and worker_id in rnd.members
                    and worker_id not in self.retiring):
                self.lost_at = self.lost_at or self.clock()  # a recovery starts (metrics: recoverySeconds)
            if (self.final_checkpoint is None and self.training_finished() and rnd is not None
                    and rnd.members[0] == worker_id):
                self.finish(Phase.FAILED, f"{worker_id} (rank 0 of the last round) exited before "
                            "saving the final checkpoint")
            self.alive.discard(worker_id)
            self.launched.discard(worker_id)
            self.retiring.discard(worker_id)
            self.stragglers.forget(worker_id)
            self.accelerating.worker_left(worker_id)  # a searcher that left: the next to ask searches
            self.strategy.worker_left(self, worker_id)
            self.rendezvous.drop(worker_id)
            self.assigned.pop(worker_id, None)
            self.cond.notify_all()

    def retire(self, worker_id: str) -> None:
        """Scale-down: the worker leaves at the next step boundary and is told to exit."""
        with self.cond:
            self.retiring.add(worker_id)
            self.departed[worker_id] = "scaled"
            self.alive.discard(worker_id)
            self.stragglers.forget(worker_id)  # no longer the job's compute (a replaced straggler: not one now)
            self.rendezvous.drop_waiter(worker_id)
            rnd = self.rendezvous.current
            if rnd is not None and worker_id in rnd.members:
                self.rendezvous.request_end()
            self.cond.notify_all()

    # ---- RPC logic -------------------------------------------------------------
    def register(self, worker_id: str, *, pid: int = 0, probe: pb.MicroBatchProbe | None = None,
                 node_check: pb.NodeCheck | None = None, node: str = "") -> str:
        """A worker is ready to train; ``probe``: what its --max-micro-batch auto probe found. Returns why it
        is refused (a failed ``--node-check``: it leaves and is replaced), "" when it is in."""
        with self.cond:
            if refused := judge_node_check(self, worker_id, node_check, node=node):
                self.dismissed.add(worker_id)  # its exit is no failure
                self.launched.discard(worker_id)  # no round waits for it
                self.cond.notify_all()
                return refused
            now = self.clock()
            self.workers[worker_id] = WorkerInfo(worker_id, now, now, pb.Position(round_id=-1), pid=pid, node=node)
            self.micro_batches.report(worker_id, probe)
            self.launched.discard(worker_id)
            self.alive.add(worker_id)
            if self.rendezvous.current is not None:
                self.rendezvous.request_end()  # a newcomer: re-form at the next step boundary
            self.cond.notify_all()
            return ""

    def replacements_left(self) -> int:
        """How many more slow workers may be replaced: the relaunch budget's worth (at least one per worker),
        never charged to it."""
        return max(1, self.spec.worker.relaunch_budget) * max(1, self.spec.worker.replicas) - self.slow_replaced

    def take_slow_workers(self) -> list[SlowWorker]:
        """Stragglers found and node checks refused since the last call (the main loop acts on them)."""
        with self.cond:
            taken, self.slow_workers = self.slow_workers, []
            self.slow_replaced += sum(1 for s in taken if s.replace)
            return taken

    def heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        with self.cond:
            info = self._touch(req.worker_id, req.position)
            if info is not None:
                info.waiting_for_peers, info.stalled_seconds = req.waiting_for_peers, req.stalled_seconds
                if req.skipped_steps > info.skipped_steps:
                    self.note(f"{req.worker_id} skipped {req.skipped_steps - info.skipped_steps} step(s) whose loss "
                              "or gradient was not finite (--nan-policy skip-step)")
                    info.skipped_steps = req.skipped_steps
                    self.skipped_steps = max(self.skipped_steps, req.skipped_steps)
                if req.lr_gain:
                    self.adascale = (req.lr_gain, req.gradient_noise_scale
                                     if req.HasField("gradient_noise_scale") else None)
                if req.HasField("memory"):
                    self.memory.record(req.worker_id, req.memory)
                if req.compute_samples and req.worker_id not in self.retiring:
                    note_compute(self, req.worker_id, seconds=req.compute_seconds, samples=req.compute_samples)
                if req.HasField("ps_traffic"):
                    add_traffic(self.ps_traffic, req.ps_traffic)
                if req.samples:
                    info.samples += req.samples
                if req.HasField("loss") and (req.samples or req.step):  # a script's may come without samples
                    info.loss = self.last_loss = req.loss
                self.script_step = max(self.script_step, req.step)
            return self._heartbeat_answer(req.position.round_id)

    def heartbeat_answer(self, round_id: int) -> pb.HeartbeatResponse:
        """What a heartbeat of a worker in round ``round_id`` is answered now (a long poll's re-check)."""
        with self.cond:
            return self._heartbeat_answer(round_id)

    def heartbeat_news(self, round_id: int) -> pb.HeartbeatResponse | None:
        """A long-polled heartbeat's answer once there is news for a worker in ``round_id``: its round
        ended, another formed since (the worker is in that one by now, or about to be: it heartbeats again
        from there, so that the newer round's end reaches it at once), a stop, the job's end; else None."""
        with self.cond:
            resp, rnd = self._heartbeat_answer(round_id), self.rendezvous.current
            moved_on = rnd is not None and rnd.round_id != round_id
            return resp if resp.end_round or resp.stop or resp.job_over or moved_on else None

    def heartbeat_key(self) -> tuple:
        """Changes whenever a heartbeat's answer may have: the current round and its state, stop, over."""
        with self.cond:
            rnd = self.rendezvous.current
            return (rnd.round_id, rnd.state) if rnd is not None else None, self.over, bool(self.stopping)

    def _heartbeat_answer(self, round_id: int) -> pb.HeartbeatResponse:
        rnd = self.rendezvous.current
        # Only the round the worker is in can be ended; a worker still adopting a
        # newer round reports its previous round id and is left alone.
        end = rnd is not None and rnd.round_id == round_id and rnd.state is not RoundState.ACTIVE
        # A script agent adopts its round before its first heartbeat in it: one behind is over for it.
        end = end or (self.spec.is_script and rnd is not None and 0 <= round_id < rnd.round_id)
        return pb.HeartbeatResponse(end_round=end, stop=self.over or bool(self.stopping), job_over=self.over)

    def _touch(self, worker_id: str, position: pb.Position) -> WorkerInfo | None:
        info = self.workers.get(worker_id)
        if info is None:
            now = self.clock()
            info = self.workers[worker_id] = WorkerInfo(worker_id, now, now, position)
            self.alive.add(worker_id)
        info.last_seen = self.clock()
        if position.round_id >= 0:  # evaluation calls carry no training position
            info.position.CopyFrom(position)
            self.step = max(self.step, position.version)
            commit_passed(self.ledger, self.assigned.get(worker_id), position)
            if position.lr_gain:  # adascale's latest estimate (what an adaptive schedule decides from)
                self.adascale = (position.lr_gain, position.gradient_noise_scale
                                 if position.HasField("gradient_noise_scale") else None)
        return info

    def has_trained(self, worker_id: str) -> bool:
        """Whether ``worker_id`` reported a step committed in a round it was given (a newcomer: its first);
        without rounds (ParameterServer: nobody waits for a newcomer) once it registered."""
        with self.cond:
            info, rnd = self.workers.get(worker_id), self.assigned.get(worker_id)
            if self.spec.strategy is Strategy.PARAMETER_SERVER:
                return info is not None
            return info is not None and rnd is not None and info.position.version > rnd.version

    # ---- time-driven checks (the master's main loop calls this) ---------------
    def tick(self, *, unscheduled: set[str] = frozenset()) -> list[tuple[str, str]]:
        """Check deadlines; returns ``(worker_id, why)`` for workers that hang (running but silent or
        stalled, or started and never registered; ``unscheduled`` pods have not started at all)."""
        with self.cond:
            now = self.clock()
            self.strategy.tick(self)
            if self.over or self.phase is Phase.SUSPENDED or self.suspension is not None:
                return []  # suspended (or suspending): no worker is wanted, none is missing
            rnd = self.rendezvous.current
            training = not self.training_finished()
            if training and (rnd is None or rnd.state is RoundState.CLOSED):
                present = len(self.alive | self.launched)
                if present < self.spec.worker.effective_min_replicas:
                    self.short_since = self.short_since or now
                    latest = self.checkpoints.latest() if self.checkpoints else None
                    kept = f"; latest checkpoint kept: {latest['checkpoint']}" if latest else ""
                    if not self.relaunching and (root := self.failures.root_cause()) is not None:
                        self.fail(root, failed_message(root, (
                            f"only {present} worker(s) left, fewer than the minimum of "
                            f"{self.spec.worker.effective_min_replicas} (--min-workers), and the relaunch budget is "
                            f"spent (--relaunch-budget){kept}")))
                    elif now - self.short_since > self.spec.worker.min_workers_timeout:
                        self.finish(Phase.FAILED, (
                            f"only {present} worker(s) alive, fewer than the minimum of "
                            f"{self.spec.worker.effective_min_replicas} (--min-workers), for "
                            f"{self.spec.worker.min_workers_timeout:.0f}s (--min-workers-timeout){kept}"))
                else:
                    self.short_since = None
            hung = find_hung(
                [Liveness(w.worker_id, now - w.last_seen, w.stalled_seconds, w.waiting_for_peers)
                 for wid in sorted(self.alive) if (w := self.workers.get(wid)) is not None],
                limit=self.spec.worker.worker_timeout,
            )
            limit = self.spec.worker.start_timeout
            hung += [(w, f"started {now - self.launched_at[w]:.0f}s ago and still not ready: importing the "
                         f"module or building the model and optimizer (--start-timeout {limit:g}s)")
                     for w in sorted(self.launched - unscheduled)
                     if w in self.launched_at and now - self.launched_at[w] > limit]
            for worker_id, why in hung:
                self.failures.killing(worker_id, f"hangs ({why})")
            return hung
