"""JobMaster: the master's state machine, driven by RPCs and process events.

One lock guards everything (ledger, rendezvous, worker table, phase); RPC
handlers and the launch backend's exit callbacks take it, and long-polling
handlers wait on its condition. The gRPC servicer is a thin translation
layer on top (``servicer.py``); nothing here knows about gRPC transport.

Stages: TRAINING (rounds of lockstep AllReduce workers, pausing for an
evaluation every ``--evaluation-steps``) -> EVALUATING (the final evaluation,
independent tasks over the validation data) -> done. Evaluation-only and
prediction jobs have no training stage (``evaluation.py``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass

from flextrain.elastic.flash import FlashStore, flash_dir
from flextrain.job import Backend, JobSpec, JobType, Strategy
from flextrain.master.accelerating import StrategyChoice
from flextrain.master.accounting import commit_passed, ledger_at, moved_past, task_failed
from flextrain.master.checkpoints import CheckpointStore, StateWriteError
from flextrain.master.evaluation import Evaluations, outcome, prediction_task, record_task, task_message
from flextrain.master.failures import FailureHandling, FailureTracker, WorkerFailure, failed_message, in_spec_words
from flextrain.master.health import Liveness, find_hung
from flextrain.master.ledger import TaskKind, TaskLedger
from flextrain.master.lockstep import AllReduceStrategy
from flextrain.master.memory import MemoryBook, MicroBatchChoice
from flextrain.master.phase import Phase
from flextrain.master.ps_tasks import ParameterServerStrategy
from flextrain.master.rendezvous import Rendezvous, Round, RoundState
from flextrain.master.rounds import RoundKeeping
from flextrain.master.script_strategy import ScriptStrategy
from flextrain.master.stragglers import SlowWorker, StragglerTracker, judge_node_check, note_compute
from flextrain.master.strategy import TrainingStrategy
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


__all__ = ["JobMaster", "Phase", "WorkerInfo", "add_traffic", "strategy_for", "task_message"]


def add_traffic(total: pb.PSTraffic, more: pb.PSTraffic) -> None:
    """Add a heartbeat's parameter-server calls to the job's sums (MergeFrom would replace, not add)."""
    for field in pb.PSTraffic.DESCRIPTOR.fields:
        setattr(total, field.name, getattr(total, field.name) + getattr(more, field.name))


class ChangeCondition(threading.Condition):
    """The master's one lock and its condition. ``notify_all`` (something changed that waiters may
    be waiting for) also calls each of ``listeners``: the asyncio server's long polls wait on an
    event of their own loop, not on this condition (flextrain/master/servicer.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list = []

    def notify_all(self) -> None:
        super().notify_all()
        for listener in self.listeners:
            listener()


def strategy_for(spec: JobSpec) -> TrainingStrategy:
    """The training strategy of ``spec`` (flextrain/master/strategy.py)."""
    if spec.is_script:
        return ScriptStrategy()
    return ParameterServerStrategy() if spec.strategy is Strategy.PARAMETER_SERVER else AllReduceStrategy()


class JobMaster(FailureHandling, RoundKeeping):
    def __init__(self, spec: JobSpec, ledger: TaskLedger, *, checkpoints: CheckpointStore | None = None,
                 failures: FailureTracker | None = None, clock=time.monotonic) -> None:
        self.spec = spec
        self.ledger = ledger
        self.clock = clock
        self.cond = ChangeCondition()
        self.rendezvous = Rendezvous(
            min_workers=spec.worker.effective_min_replicas,
            max_workers=spec.worker.effective_max_replicas,
            timeout=spec.worker.rendezvous_timeout,
        )
        self.workers: dict[str, WorkerInfo] = {}
        self.launched: set[str] = set()  # started, not registered yet
        self.alive: set[str] = set()  # registered, not seen exiting
        self.assigned: dict[str, Round] = {}  # worker -> round it was placed in
        self.phase = Phase.PENDING
        self.message = ""
        self.evaluations = Evaluations(ledger, every=spec.training.evaluation_steps)
        self.metrics: dict[str, float] = {}  # the latest evaluation's metrics
        self.rounds_formed = 0
        self.step = 0  # highest model version any worker reported
        self.script_step = 0  # script jobs: the highest step a script reported (flextrain.elastic.progress)
        self.last_loss: float | None = None  # None: no training loss reported yet (NaN is a loss)
        self.store_host = "127.0.0.1"
        self.store_port = 0
        self.restore_checkpoint = ""  # what the first round's rank 0 loads (resume)
        self.final_checkpoint: str | None = None
        self.checkpoints = checkpoints
        # --memory-checkpoint-steps: the job's in-memory snapshots (flextrain/elastic/flash.py), which the
        # master flushes when every worker is lost and removes when the job ends (AllReduce training jobs).
        self.flash = (FlashStore(flash_dir(spec.name, spec.job_dir))
                      if checkpoints is not None and spec.training.memory_checkpoint_steps
                      and spec.strategy is Strategy.ALLREDUCE and spec.job_type is JobType.TRAINING
                      and not spec.is_script else None)
        self.recorded_version = -1  # the newest checkpoint recorded by this master (flash reports below it: late)
        self.initial_ledger = ledger.to_dict()  # rollback target when no checkpoint exists
        self.retiring: set[str] = set()  # scaled away: told to stop at the next rendezvous
        self.departed: dict[str, str] = {}  # why workers left, where the master chose it (the job's history)
        self.stopping: str | None = None  # stop reason while waiting for the stop checkpoint
        self.suspension: str | None = None  # a suspend's reason while its workers leave (master/suspension.py)
        self.short_since: float | None = None  # since when fewer than min workers are alive
        self.events: list[str] = []
        self.round_history: list[dict] = []  # every round formed: who, from which version
        self.started = time.time()
        self.finished: float | None = None
        self.ps_addresses: list[str] = []  # ParameterServer strategy: PS i's host:port at index i
        self.failures = failures or FailureTracker()
        self.failure: WorkerFailure | None = None  # the job's root cause, when it failed of one
        self.dismissed: set[str] = set()  # told there is nothing more to do: may exit 0
        self.relaunching = True  # False once the relaunch budget is spent
        self.relaunch_causes: dict[str, int] = {}  # relaunches decided, by failure kind (metrics)
        self.unauthenticated_calls = 0  # --tls: calls refused for lacking the job's token (metrics)
        self.skipped_steps = 0  # steps dropped as non-finite, as the workers report them
        # --lr-rule adascale: (gain, gradient noise scale or None) of the latest step a worker reported
        # (every member of a round computes the same); None: none reported yet.
        self.adascale: tuple[float, float | None] | None = None
        self.launched_at: dict[str, float] = {}  # launch times, for workers that never finish starting
        self.lost_at: float | None = None  # when a member of the running round was lost, until the next round
        self.ps_traffic = pb.PSTraffic()  # the workers' parameter-server calls, summed (metrics)
        # training-task GetTask calls per worker (status.json taskAsks; AllReduce: rank 0's, worker/round_tasks.py)
        self.task_asks: dict[str, int] = {}
        self.micro_batches = MicroBatchChoice(spec)  # each round's M (--max-micro-batch auto: the probes)
        self.memory = MemoryBook()  # the workers' latest memory samples and the job's peak
        # Slow workers (flextrain/master/stragglers.py): found here, acted on by the main loop.
        self.stragglers = StragglerTracker(factor=spec.worker.straggler_factor)
        self.slow_workers: list[SlowWorker] = []
        self.slow_replaced = 0
        # --accelerate: the job's training strategy (auto: chosen by one worker's search, kept in the job dir)
        self.accelerating = StrategyChoice(spec, clock=clock)
        self.strategy = strategy_for(spec)  # what differs between AllReduce and ParameterServer
        # What the user reads names settings as the user wrote them: flags, or ElasticJob fields.
        self.words = in_spec_words if spec.backend is Backend.KUBERNETES else str

    def kept_checkpoint(self) -> str:
        """``"; the last good checkpoint is kept: PATH (step N)"``, or "" without one: how a message
        about a failed write says what a resume continues from."""
        latest = self.checkpoints.latest() if self.checkpoints else None
        return f"; the last good checkpoint is kept: {latest['checkpoint']} (step {latest['version']})" if latest else ""

    def training_finished(self) -> bool:
        """Whether the training part of the job is done (the ledger's, or a script job's own)."""
        return self.strategy.training_finished(self)

    @property
    def resume_hint(self) -> str:
        return f"flextrain {'run' if self.spec.is_script else 'train'} --resume {self.spec.job_dir}"

    def mark_running(self) -> None:
        if self.phase is Phase.PENDING:
            self.phase = Phase.RUNNING

    # ---- lifecycle ------------------------------------------------------------
    @property
    def over(self) -> bool:
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED)

    def finish(self, phase: Phase, message: str) -> None:
        with self.cond:
            if self.over:
                return
            self.phase, self.message = phase, self.words(message)
            self.finished = time.time()
            self.cond.notify_all()

    def fail(self, failure: WorkerFailure | None, message: str) -> None:
        """Fail the job with ``message``; ``failure``, a worker's, is its root cause (shown in
        status, CLI and CR status). A no-op once the job is over."""
        with self.cond:
            if not self.over:
                self.failure = failure and dataclasses.replace(
                    failure, message=self.words(failure.message), reason=self.words(failure.reason))
                self.finish(Phase.FAILED, message)

    def check_outcome(self) -> None:
        if self.over:
            return
        if self.ledger.error:
            self.finish(Phase.FAILED, self.ledger.error)
        elif self.spec.job_type is not JobType.TRAINING:
            if (result := outcome(self)) is not None:
                self.finish(Phase.SUCCEEDED if result[0] else Phase.FAILED, result[1])
        elif (
            self.training_finished()
            and self.final_checkpoint is not None
            and (not self.ledger.evaluation_shards or self.ledger.evaluation_finished())
        ):
            self.finish(Phase.SUCCEEDED, "training finished")

    # ---- membership (launch backend side) --------------------------------------
    def worker_launched(self, worker_id: str) -> None:
        with self.cond:
            self.launched.add(worker_id)
            self.launched_at[worker_id] = self.clock()
            self.cond.notify_all()

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
            self.rendezvous.drop_waiter(worker_id)
            rnd = self.rendezvous.current
            if rnd is not None and worker_id in rnd.members:
                self.rendezvous.request_end()
            self.cond.notify_all()

    def flush_flash(self, *, why: str = "every worker of the last round was lost") -> int | None:
        """Persist the newest in-memory snapshot when it is newer than the newest checkpoint (``why``:
        every worker lost, a resume, the job's end); the snapshots are cleared after, as the model goes
        back to that checkpoint. Returns the version persisted, or None."""
        if self.flash is None:
            return None
        try:
            version = self.checkpoints.adopt_flash(self.flash, note=self.note)
        except OSError as exc:  # StateWriteError (a full disk) names the file; the older checkpoint stays
            self.note(f"the newest in-memory checkpoint could not be persisted: {exc}")
            version = None
        if version is not None:
            self.recorded_version = max(self.recorded_version, version)
            self.note(f"in-memory checkpoint of step {version} persisted ({why})")
        self.flash.clear()
        return version

    def note(self, message: str) -> None:
        """An event worth showing the user (status message, log)."""
        message = self.words(message)
        with self.cond:
            self.events.append(message)
            if not self.over:
                self.message = message

    def request_stop(self, reason: str) -> tuple[bool, str]:
        """Stop at the next step boundary, after rank 0 writes a checkpoint."""
        with self.cond:
            if self.over:
                return False, f"job already {self.phase.value}"
            self.stopping = reason
            rnd = self.rendezvous.current
            if self.strategy.stops_at_once(self):  # e.g. the model is on the PS: no stop checkpoint
                self.finish(Phase.FAILED, f"stopped: {reason}; resume with `{self.resume_hint}`")
            elif rnd is None or rnd.state is RoundState.CLOSED or self.training_finished():
                self.finish(Phase.FAILED, f"stopped: {reason}")
            else:
                self.message = f"stopping: {reason}"
            self.cond.notify_all()
            return True, self.message if self.over else "stopping at the next step boundary"

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

    def accelerate(self, req: pb.AccelerateRequest) -> pb.AccelerateResponse:
        """--accelerate auto: the job's strategy, or SEARCH / WAIT (flextrain/master/accelerating.py)."""
        with self.cond:
            response, event = self.accelerating.ask(req.worker_id, req.strategy_json, req.search_json)
            if event:
                self.note(event)
            return response

    def get_task(self, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        with self.cond:
            response = self._get_task(req)
            done = response.action == pb.GetTaskResponse.NO_MORE and (
                req.kind == pb.Task.TRAINING or self.training_finished())
            if response.action == pb.GetTaskResponse.STOP or done:
                self.dismissed.add(req.worker_id)  # its exit (code 0) is no failure
            return response

    def _get_task(self, req: pb.GetTaskRequest) -> pb.GetTaskResponse:
        with self.cond:
            self._touch(req.worker_id, req.position)
            if req.kind == pb.Task.TRAINING:
                self.task_asks[req.worker_id] = self.task_asks.get(req.worker_id, 0) + 1
            if req.kind in (pb.Task.EVALUATION, pb.Task.PREDICTION):
                if self.over or self.stopping or req.worker_id in self.retiring:
                    return pb.GetTaskResponse(action=pb.GetTaskResponse.STOP, message=self.message)
                response = (prediction_task(self, req) if req.kind == pb.Task.PREDICTION
                            else self.strategy.evaluation_task(self, req))
                self.check_outcome()
                if self.over and response.action != pb.GetTaskResponse.RUN:
                    return pb.GetTaskResponse(action=pb.GetTaskResponse.STOP, message=self.message)
                return response
            return self.strategy.training_task(self, req)

    def report_task(self, req: pb.ReportTaskRequest) -> None:
        with self.cond:
            task = self.ledger.doing.get(req.task_id)
            if task is None:
                return  # already settled (e.g. its round closed first)
            if not req.ok:
                self.ledger.fail(req.task_id, req.steps_done, f"{req.worker_id}: {req.error}")
                task_failed(self.assigned.get(req.worker_id), req.task_id, req.steps_done)
                if req.HasField("failure"):
                    self._task_failed(req)
            elif task.kind is not TaskKind.TRAINING:
                record_task(self, task, req)
            else:
                self.ledger.complete(req.task_id)
            self.check_outcome()
            self.cond.notify_all()

    def report_checkpoint(self, req: pb.ReportCheckpointRequest) -> pb.ReportCheckpointResponse:
        if req.memory:
            return pb.ReportCheckpointResponse(ledger_json=self.mark_snapshot(req))
        if not (req.final or req.stop):
            return self._record_periodic(req)
        with self.cond:
            self._touch(req.worker_id, req.position)
            if req.ledger_json and (self.checkpoints is None or self.over
                                    or req.position.version <= self.recorded_version):
                return pb.ReportCheckpointResponse()  # a persisted snapshot overtaken by a newer checkpoint
            if self.checkpoints is not None:
                try:
                    ledger = (json.loads(req.ledger_json) if req.ledger_json
                              else ledger_at(self.ledger, self.rendezvous.current, req.position))
                    self.checkpoints.record(checkpoint=req.path, version=req.position.version,
                                            ledger=ledger, final=req.final)
                    self.recorded_version = max(self.recorded_version, req.position.version)
                except StateWriteError as exc:  # e.g. a full disk: the previous checkpoint stays the latest
                    self._checkpoint_not_recorded(req, exc)
                    return pb.ReportCheckpointResponse()
            if req.final:
                self.final_checkpoint = req.path
            if req.stop and self.suspension is not None:
                self.note(f"suspend checkpoint at step {req.position.version}: {req.path}")
            elif req.stop and self.stopping:
                self.finish(Phase.FAILED, f"stopped: {self.stopping}; checkpoint at step "
                            f"{req.position.version}: resume with `flextrain train --resume {self.spec.job_dir}`")
            self.check_outcome()
            self.cond.notify_all()
        return pb.ReportCheckpointResponse()

    def _record_periodic(self, req: pb.ReportCheckpointRequest) -> pb.ReportCheckpointResponse:
        """A periodic checkpoint (``--checkpoint-steps``, a persisted in-memory snapshot). Its ledger is
        taken under the job's lock, at the reported position; its two fsync'd files are written outside
        it: every worker's heartbeats and task calls would otherwise wait on the disk (the asyncio
        server serves them inline). The store keeps writers in order; a persisted snapshot (it carries
        its ledger) older than a recorded checkpoint is not recorded."""
        snapshot = bool(req.ledger_json)
        with self.cond:
            self._touch(req.worker_id, req.position)
            if self.checkpoints is None or (snapshot and (self.over or req.position.version <= self.recorded_version)):
                return pb.ReportCheckpointResponse()
            ledger = (json.loads(req.ledger_json) if snapshot
                      else ledger_at(self.ledger, self.rendezvous.current, req.position))
        try:
            recorded = self.checkpoints.record(checkpoint=req.path, version=req.position.version, ledger=ledger,
                                               final=False, newer_only=snapshot)
        except StateWriteError as exc:  # e.g. a full disk: the previous checkpoint stays the latest
            with self.cond:
                self._checkpoint_not_recorded(req, exc)
            return pb.ReportCheckpointResponse()
        with self.cond:
            if recorded:
                self.recorded_version = max(self.recorded_version, req.position.version)
            self.check_outcome()
            self.cond.notify_all()
        return pb.ReportCheckpointResponse()

    def _checkpoint_not_recorded(self, req: pb.ReportCheckpointRequest, exc: StateWriteError) -> None:
        """A checkpoint's files could not be written: the job fails naming the file and the reason, and
        the last good checkpoint (caller holds the lock)."""
        self.finish(Phase.FAILED, f"cannot record the checkpoint of step {req.position.version}: "
                    f"{exc}{self.kept_checkpoint()}")
        self.cond.notify_all()

    def mark_snapshot(self, req: pb.ReportCheckpointRequest) -> str:
        """The ledger state (JSON) of a model that committed exactly up to ``req.position``: what an
        in-memory snapshot taken there is persisted with; "" when the master can no longer tell.

        Rank 0 does not wait for this answer (worker/flash.py: its writer thread does), so the round
        may have gone on meanwhile. Inside the snapshot's round the answer is exact while the ledger
        holds no outcome the snapshot's model lacks (``moved_past``: its task completed or failed at
        another step, a later task done or failed with steps applied). After a round change it is exact
        while nothing beyond the snapshot's step was committed (the new round starts at its version)."""
        with self.cond:
            pos = req.position
            info = self.workers.get(req.worker_id)
            if info is not None and (info.position.round_id, info.position.version) > (pos.round_id, pos.version):
                info.last_seen = self.clock()  # a late mark: the worker's newer position stays
            else:
                self._touch(req.worker_id, pos)
            rnd = self.rendezvous.current
            if self.checkpoints is None or self.over or rnd is None:
                return ""
            if rnd.round_id == pos.round_id:
                if moved_past(self.ledger, rnd, pos):
                    return ""
            elif rnd.version != pos.version or any(
                    w.position.round_id == rnd.round_id and w.position.version > pos.version
                    for w in self.workers.values()):
                return ""
            return json.dumps(ledger_at(self.ledger, rnd, pos))

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
                if req.compute_samples:
                    note_compute(self, req.worker_id, seconds=req.compute_seconds, samples=req.compute_samples)
                if req.HasField("ps_traffic"):
                    add_traffic(self.ps_traffic, req.ps_traffic)
                if req.samples:
                    info.loss, info.samples = req.loss, info.samples + req.samples
                    self.last_loss = req.loss
                elif req.step and req.loss == req.loss:  # a script's loss without a sample count (not NaN)
                    info.loss = self.last_loss = req.loss
                self.script_step = max(self.script_step, req.step)
            rnd = self.rendezvous.current
            # Only the round the worker is in can be ended; a worker still adopting a
            # newer round reports its previous round id and is left alone.
            end = rnd is not None and rnd.round_id == req.position.round_id and rnd.state is not RoundState.ACTIVE
            # A script agent adopts its round before its first heartbeat in it: one behind is over for it.
            end = end or (self.spec.is_script and rnd is not None and 0 <= req.position.round_id < rnd.round_id)
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

