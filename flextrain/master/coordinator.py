"""JobMaster: the master's state machine, driven by RPCs and process events.

One lock guards everything (ledger, rendezvous, worker table, phase); RPC
handlers and the launch backend's exit callbacks take it, and long-polling
handlers wait on its condition. The gRPC servicer is a thin translation
layer on top (``servicer.py``); nothing here knows about gRPC transport.

Stages: TRAINING (rounds of lockstep AllReduce workers, pausing for an
evaluation every ``--evaluation-steps``) -> EVALUATING (the final evaluation,
independent tasks over the validation data) -> done. Evaluation-only and
prediction jobs have no training stage (``evaluation.py``).

JobMaster's parts live in mixins, one job each: the worker table and its
heartbeats (``worker_table.py``), rendezvous rounds (``rounds.py``), worker
failures (``failures.py``) and reported checkpoints (``checkpoint_reports.py``).
"""

from __future__ import annotations

import dataclasses
import threading
import time

from flextrain.elastic.flash import FlashStore, flash_dir
from flextrain.job import Backend, JobSpec, JobType, Strategy
from flextrain.master.accelerating import StrategyChoice
from flextrain.master.accounting import task_failed
from flextrain.master.checkpoint_reports import CheckpointReports
from flextrain.master.checkpoints import CheckpointStore
from flextrain.master.evaluation import Evaluations, outcome, prediction_task, record_task, task_message
from flextrain.master.failures import FailureHandling, FailureTracker, WorkerFailure, in_spec_words
from flextrain.master.ledger import TaskKind, TaskLedger
from flextrain.master.lockstep import AllReduceStrategy
from flextrain.master.memory import MemoryBook, MicroBatchChoice
from flextrain.master.phase import Phase
from flextrain.master.ps_tasks import ParameterServerStrategy
from flextrain.master.rendezvous import Rendezvous, Round, RoundState
from flextrain.master.rounds import RoundKeeping
from flextrain.master.script_strategy import ScriptStrategy
from flextrain.master.stragglers import SlowWorker, StragglerTracker
from flextrain.master.strategy import TrainingStrategy
from flextrain.master.worker_table import WorkerInfo, WorkerTable, add_traffic
from flextrain.proto import flextrain_pb2 as pb

__all__ = ["JobMaster", "Phase", "WorkerInfo", "add_traffic", "strategy_for", "task_message"]


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


class JobMaster(FailureHandling, RoundKeeping, WorkerTable, CheckpointReports):
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
        self.store_host = "127.0.0.1"  # what workers dial for the job's stores
        self.store_bind = "127.0.0.1"  # what the stores listen on (a wildcard: every interface)
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
        self.recorded_records = 0  # training records the newest recorded checkpoint keeps (its ledger's)
        # the in-memory snapshots' ledgers, resolved before any outcome is recorded (checkpoint_reports.py)
        self.snapshot_rounds: dict[int, Round] = {}
        self.snapshot_ledgers: dict[str, dict] = {}
        self.snapshots_seen: dict[str, None] = {}  # (ordered) snapshots found in this master's shared memory
        self.snapshots_refused = 0
        if self.flash is not None:
            ledger.before_outcome = self.resolve_snapshots
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
        # changes of the desired worker count as the instance manager made them: (clock, previous, desired),
        # for the history's scale records (recorded when asked, not at the next status snapshot)
        self.scales: list[tuple[float, int, int]] = []
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
            owed = 0 if self.spec.is_script else self.ledger.records_total - self.ledger.records_done
            if owed:  # a ledger that lost (or twice counted) a task must not pass for a finished job
                wrong = f"{owed} of the job's {self.ledger.records_total} training records not applied" if owed > 0 \
                    else f"{-owed} training records counted beyond the job's {self.ledger.records_total}"
                self.finish(Phase.FAILED, f"internal error: training ended with {wrong} (a flextrain bug: please "
                                          "report it with this job's directory)")
            else:
                self.finish(Phase.SUCCEEDED, "training finished")

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
