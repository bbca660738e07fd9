"""The AllReduce trainer: lockstep optimizer steps inside one rendezvous round.

Per task, step ``j`` covers records ``[start + j*G, start + (j+1)*G)``; the
planner (``flextrain.elastic.planner``) gives this rank its contiguous slice
and its micro-batches. Each micro-batch contributes ``loss_mean * n / G`` to
the backward pass, so after the SUM all-reduce every rank holds exactly the
gradient of the mean loss over the step's G samples, however they were split.
Tasks come from ``round_tasks.RoundTasks``: rank 0 asks the master, and
broadcasts each answer to the round at the task boundary.

The protocol is framework-neutral: a model backend (``backend.py``: PyTorch,
or ``tf/backend.py``: Keras) computes the micro-batches' gradients into flat
buffers, one per parameter dtype (torch ``p.grad`` are views into them; Keras
gradients are added into numpy views of them), applies the optimizer and
moves state. Every buffer is summed in its own dtype, and the first one ends
with control slots that ride along in the same all-reduce:

* ``END_ROUND`` - some member was asked by the master to leave the round at
  this step boundary; the sum makes every member agree on the same boundary.
* ``FAILED`` - some member could not read or ``feed`` its records; nobody
  applies the step, the failing member has already reported the task.
* ``STOP`` - the job is stopping: after this step rank 0 writes a checkpoint
  (reported with its exact position, so a resumed job applies every record
  once) and every member exits.
* ``NONFINITE`` - some member's loss was NaN or infinite. With the reduced
  gradients (also checked), every member decides alike: nothing of the step
  is applied, and the job fails (``--nan-policy fail``) or the step is
  dropped (``skip-step``: its records count as trained).
* ``REDO`` - some member's bucket left before its gradient was final (see below): every
  member sums the step's gradients again, flat, and reduces flat from then on.

Overlapped reduction (PyTorch; ``flextrain.worker.buckets``): unless ``--bucket-mb 0`` (or the
model is one bucket, which could not leave before backward ends anyway),
the gradients are summed in buckets launched asynchronously from autograd hooks while the
LAST micro-step's backward runs (earlier micro-steps only accumulate), every rank in the same
bucket order; the control slots ride with the last (tail) bucket, launched after backward
once the flags are set, and every bucket is waited for before anything is decided. A rank
whose compute failed launches its remaining buckets too (zeros), so the collectives match; a
peer lost with buckets in flight is a :class:`CollectiveError`, as on the flat path.
Either way, once a step's sums are launched the training thread reads and ``feed``s the next
step's records (unless a read-ahead thread does), then waits for them.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from pathlib import Path

from flextrain.elastic.flash import FlashStore, flash_dir
from flextrain.elastic.planner import plan_step
from flextrain.elastic.schedule import lr_factor
from flextrain.elastic.statecodec import Encoded, StateCodecError, decode, encode, encode_indexed, nonfinite
from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.adascale import AdaScaleRule
from flextrain.worker.buckets import bucket_bytes
from flextrain.worker.checkpoints import checkpoint_path, write_checkpoint
from flextrain.worker.client import MasterClient
from flextrain.worker.frameworks import make_backend
from flextrain.worker.collective import Collective
from flextrain.worker.failure import NonFiniteError, describe, failure_of, log_failure, one_line
from flextrain.worker.flash import FlashCheckpointer
from flextrain.worker.module import FeedMetadata, Mode, ModelDef
from flextrain.worker.prefetch import StepLoader, read_ahead_wanted
from flextrain.worker.reading import read_task_records, task_reader
from flextrain.worker.round_tasks import RoundTasks
from flextrain.worker.state import WorkerState

log = logging.getLogger("flextrain.worker")

END_ROUND, FAILED, STOP, NONFINITE, REDO = 0, 1, 2, 3, 4
_CONTROL_SLOTS = 5


class AllReduceTrainer:
    """The round protocol, framework-neutral: the model is driven through a
    :class:`~flextrain.worker.backend.ModelBackend` (PyTorch or Keras) whose per-dtype
    gradient buffers, the first followed by the control slots, are what the collective reduces."""

    def __init__(self, *, spec: JobSpec, model_def: ModelDef, model, optimizer, client: MasterClient,
                 collective: Collective, state: WorkerState, evaluate=None, compute=None) -> None:
        """``evaluate(version)``, when given, is called after every committed step whose version is
        a multiple of ``spec.training.evaluation_steps``; it returns once that evaluation is complete.
        ``compute``: the job's training strategy as applied (``--accelerate``; ``model`` is its core)."""
        self.spec = spec
        self.evaluate = evaluate
        self.model_def = model_def
        self.model = model
        self.optimizer = optimizer
        self.client = client
        self.collective = collective
        self.state = state
        self.backend = make_backend(model_def=model_def, model=model, optimizer=optimizer, extra=_CONTROL_SLOTS,
                                    keep_lr=self.spec.training.learning_rate is not None, compute=compute)
        self.control = self.backend.slots  # END_ROUND, FAILED, STOP, ...: the end of backend.buffers[0]
        cap = bucket_bytes(spec.training.bucket_mb)  # 0: one flat reduction after backward
        self.overlap = cap > 0 and self.backend.overlap(cap)  # buckets reduced during backward
        self.loader = StepLoader(self._load_span, background=read_ahead_wanted())
        self._reader = None  # ((task id, source), read(start, end)): the current task's (_load_span)
        # The round's task answers: rank 0 asks the master (ahead, too), the others get them from it.
        self.tasks = RoundTasks(client=client, collective=collective, state=state)
        self._lr_factor: float | None = None  # --lr-rule's factor now set on the optimizer (None: not set)
        self.adascale: AdaScaleRule | None = None  # --lr-rule adascale: the gain, measured per step
        # M this worker plans its steps with: its round's (JoinRendezvousResponse.max_micro_batch), the same
        # on every member; until a round gives one, the job's setting.
        self.max_micro_batch = spec.training.effective_max_micro_batch
        if spec.training.effective_lr_rule == "adascale":  # --batch-schedule adaptive implies it
            self.adascale = AdaScaleRule(reference=spec.training.effective_reference_batch_size)
            self.backend.measure_micro_batches()
        # --memory-checkpoint-steps: rank 0's in-memory snapshots, persisted in the background (worker/flash.py)
        every = spec.training.memory_checkpoint_steps
        self.flash = FlashCheckpointer(store=FlashStore(flash_dir(spec.name, spec.job_dir)),
                                       checkpoints=spec.checkpoint_dir, client=client,
                                       every=every,
                                       persist_every=spec.training.memory_checkpoint_persist_every,
                                       persist_seconds=spec.training.memory_checkpoint_persist_seconds,
                                       ) if every else None

    def prepare(self, sample: pb.Task | None) -> None:
        """Before registering (a spare: parking), get the backend ready for steps on the records of
        ``sample`` (GetJobSpecResponse.sample; Keras traces), so that no round waits for it later.
        A failure loses only this head start (logged); the steps meet and report it as they would."""
        if sample is None:
            return
        records = partial(read_task_records, self.model_def, sample.source, sample.start, sample.end,
                          mode=Mode.TRAINING, data_origin=self.spec.data.training)
        meta = FeedMetadata(sample.source, sample.start, sample.end, 0)
        try:
            self.backend.prepare(lambda: self.backend.feed(records(), Mode.TRAINING, meta))
        except Exception as exc:  # noqa: BLE001 - a head start, not a step: the steps report what is wrong
            log.warning("could not prepare the model ahead on records [%d, %d) of %s (%s); it is prepared at "
                        "its first step instead", sample.start, sample.end, sample.source, describe(exc))

    # ---- state transfer ---------------------------------------------------------
    def state_tree(self) -> dict:
        """What a newcomer gets and a checkpoint holds: model, optimizer, version (and AdaScale's estimates)."""
        tree = {**self.backend.state(), "version": self.state.version}
        if self.adascale is not None:
            tree["adascale"] = self.adascale.state()
        return tree

    def state_blob(self) -> bytes:
        return encode(self.state_tree())

    def state_encoded(self) -> Encoded:
        """:meth:`state_blob` with its header as built (a snapshot's writer checks it without a parse)."""
        return encode_indexed(self.state_tree())

    def load_blob(self, blob: bytes) -> None:
        tree = decode(blob)
        self.backend.load_state(tree)
        self.state.version = int(tree["version"])
        if self.adascale is not None:
            self.adascale.load(tree.get("adascale"))
        self._lr_factor = None  # the loaded optimizer holds the checkpoint's (or the built) LR: set it again

    def sync_state(self, *, restore_from: str = "", in_sync_at: int | None = None, synced: bool = False) -> None:
        """Rank 0 (the most advanced member) sends model + optimizer to the round. ``in_sync_at``: the
        master found every member synced in the last round at this version (``members_in_sync``): all
        hold the round's state and none broadcasts (all got the same answer); ``synced``: this worker
        had finished its last round's sync."""
        if in_sync_at is not None and not restore_from:
            if self.state.version != in_sync_at or not synced:  # training on would split the members' models
                raise RuntimeError(f"round {self.state.round_id} starts in sync at version {in_sync_at}, but this "
                                   f"worker is at version {self.state.version}{'' if synced else ', not synced'}")
            return
        if restore_from and self.collective.rank == 0:
            with open(restore_from, "rb") as f:
                blob = f.read()
            try:
                self.load_blob(blob)
            except StateCodecError as exc:  # the master verified it: changed since, or a different file
                raise StateCodecError(f"checkpoint {restore_from} cannot be restored: {exc}") from exc
        if self.collective.world_size == 1:
            return
        blob = self.collective.broadcast_bytes(self.state_blob() if self.collective.rank == 0 else None)
        if self.collective.rank != 0:
            self.load_blob(blob)

    # ---- training -------------------------------------------------------------
    def ask_first_task(self, *, rank: int, given: pb.Task | None = None) -> None:
        """As soon as the rendezvous answers, rank ``rank`` of the new round asks for its first task (rank 0
        does, :meth:`RoundTasks.ask_first`): the answer travels while the round's group forms and its state
        syncs (a plain ask after them is a round trip more on a recovery's path). ``given``: the first task
        came with the rendezvous answer: nobody asks."""
        self.tasks.ask_first(rank=rank, given=given)

    def run_round(self) -> int:
        """Train until the round ends; returns the GetTask action that ended it."""
        index = 0
        self.tasks.reset(keep_first=True)  # (ask_first_task's answer, when it asked)
        while True:
            self.state.task_index, self.state.steps_done = index, 0
            resp = self.tasks.answer(index)  # rank 0 asks the master; the others get its answer
            self.state.mark_progress()
            if resp.action != pb.GetTaskResponse.RUN:
                return resp.action
            started = time.monotonic()
            outcome = self.run_task(resp.task)
            if outcome is not None:
                self.tasks.reset()
                return outcome
            self.tasks.timed(time.monotonic() - started)
            index += 1

    def run_task(self, task: pb.Task) -> int | None:
        """Run every step of ``task``; returns END_ROUND/STOP when the round ends inside it."""
        G = task.global_batch_size
        steps = -(-(task.end - task.start) // G)
        self._follow_lr(G)
        planned = None  # the next step's (start, end, plan): to load it ahead, and then to run it
        for j in range(steps):
            start, end, plan = planned or self._plan(task, j)
            planned = self._plan(task, j + 1) if j + 1 < steps and (
                self.loader.background or self.collective.world_size > 1) else None
            if j + 1 == steps:
                self.tasks.ask_ahead()
            self.backend.zero()
            overlap = self.overlap and self.collective.world_size > 1
            try:
                began = time.monotonic()
                batch = self.loader.get(task, start, end) if end > start else None
                if planned and self.loader.background:  # read the next step while this one computes
                    self.loader.prefetch(task, *planned[:2])
                loss_sum, n = self._compute(batch, plan, arm=overlap)
                self.state.add_compute(time.monotonic() - began, end - start)
            except Exception as exc:  # bad data or a failing feed: the task fails, the round goes on
                if not overlap:  # (buckets may be in flight: what they sum is not applied anywhere)
                    self.backend.zero()
                failure = failure_of(exc, stage="training", step=self.state.version)
                log_failure(f"step {self.state.version + 1} (task {task.task_id}, records [{start}, {end}) of "
                            f"{task.source}) failed: {one_line(failure)}", exc)
                self.client.report_task(task.task_id, ok=False, steps_done=j, error=one_line(failure),
                                        failure=failure)
                self.control[FAILED] = 1.0
                loss_sum, n = 0.0, 0
            if self.state.end_round.is_set():
                self.control[END_ROUND] = 1.0
            if self.state.stop.is_set():
                self.control[STOP] = 1.0
            if not math.isfinite(loss_sum):
                self.control[NONFINITE] = 1.0
            # (also in a world of one: AdaScale's statistic is taken from the backend here)
            reduced = self.backend.buffers if self.adascale is None else self.adascale.reduced(self.backend)
            if self.collective.world_size > 1:
                # the next step's records, read and fed while the sums travel (unless a loader thread has them)
                ahead = (task, *planned[:2]) if planned and not self.loader.background else None
                if overlap:
                    self._reduce_overlapped(ahead)
                else:
                    self.backend.gathered()
                    self._sum(reduced, ahead=ahead)
            control = self.control.tolist()
            if control[FAILED] == 0:
                # Every member sees the same reduced gradients and flags, so all decide alike.
                if control[NONFINITE] == 0 and self.backend.finite():
                    if self.adascale is not None:  # the same LR on every rank: all inputs are the same
                        self.adascale.set_lr(self.backend, plan)
                        self.state.lr_factor, self.state.noise_scale = self.adascale.gain, self.adascale.noise_scale
                    self.backend.apply()
                    self.state.add_loss(loss_sum, n)
                else:
                    self._non_finite(task, start, end, loss=control[NONFINITE] > 0)
                with self.state.lock:
                    self.state.version += 1
                    self.state.steps_done = j + 1
            self.state.mark_progress()
            every = self.spec.training.checkpoint_steps
            if control[STOP] > 0:
                return pb.GetTaskResponse.STOP  # the caller writes the stop checkpoint
            if self.collective.rank == 0 and every and control[FAILED] == 0 and self.state.version % every == 0:
                self.checkpoint()
            elif self.collective.rank == 0 and self.flash is not None and control[FAILED] == 0 \
                    and self.flash.due(self.state.version):
                self.flash.snapshot(self.state_encoded, self.state.position())  # the copy; the rest in the background
            evaluation = self.spec.training.evaluation_steps
            if self.evaluate and evaluation and control[FAILED] == 0 and self.state.version % evaluation == 0:
                # Every member holds this same model (lockstep): all take part, even when the
                # round ends at this boundary, so the evaluation is never skipped.
                self.evaluate(self.state.version)
            if control[END_ROUND] > 0:
                return pb.GetTaskResponse.END_ROUND
            if control[FAILED] > 0:
                return None  # skip the rest of the failed task; go on with the next one
        return None

    def _reduce_overlapped(self, ahead: tuple | None) -> None:
        """After the step's compute: launch what backward's hooks did not (in bucket order), then
        the tail with the control slots (and AdaScale's statistic), load ``ahead`` (the next step's
        span, :meth:`_load_ahead`) and wait for all of it."""
        start = self.collective.start_sum
        self.backend.launch_buckets(start)
        if self.backend.spoiled:
            self.control[REDO] = 1.0
        self.backend.launch_tail(start)
        if self.adascale is not None:  # its statistic, set by adascale.reduced()
            start(self.adascale.stats)
        self._load_ahead(ahead)
        self._wait_sums()
        # the same on every rank: all sum again, flat, and stay flat (read as a list: cheaper than a tensor's item)
        if self.control.tolist()[REDO] > 0:
            self._sum(self.backend.redo_flat())
            self.overlap = False
            log.warning("a gradient was accumulated after its bucket was reduced (a parameter used inside and "
                        "outside re-entrant activation checkpointing?); step %d was reduced again in one "
                        "piece, and later steps are reduced after backward", self.state.version + 1)

    def _sum(self, tensors, *, ahead: tuple | None = None) -> None:
        """Sum ``tensors`` across the round (``Collective.all_reduce_sum``, with ``ahead`` loaded
        while they travel)."""
        for tensor in tensors:
            self.collective.start_sum(tensor)
        self._load_ahead(ahead)
        self._wait_sums()

    def _wait_sums(self) -> None:
        """Wait for the sums started; meanwhile this worker reports itself blocked on its peers (a
        member stalled elsewhere, e.g. in ``feed``, is the one the master's health check names)."""
        self.state.waiting = True
        try:
            self.collective.wait_all()
        finally:
            self.state.waiting = False

    def _load_ahead(self, ahead: tuple | None) -> None:
        """Read and ``feed`` ``ahead`` = ``(task, start, end)``, the next step's span, while this step's
        sums are in flight: the training thread would only wait for them (for a step of a few ms,
        most of it: bench/README.md, ddp_steady.py). A span the next step does not ask for (the round
        ended at this boundary) is dropped; an error surfaces when the step takes the span."""
        if ahead is not None and ahead[2] > ahead[1]:
            self.loader.load_ahead(*ahead)

    def _follow_lr(self, G: int) -> None:
        """--lr-rule: the optimizer's LR for steps of ``G`` samples (every step of a task has the same G;
        the master cuts tasks so, following a batch schedule). Each change is logged with the step."""
        rule = self.spec.training.effective_lr_rule
        if rule == "adascale":
            self.adascale.follow(G, step=self.state.version)  # the LR itself is set per step
        if rule in ("none", "adascale"):
            return
        factor = lr_factor(rule, G, self.spec.training.effective_reference_batch_size)
        if factor != self._lr_factor:
            lrs = self.backend.scale_lr(factor)
            self._lr_factor = factor
            log.info("from step %d: global batch %d, learning rate %s (%s rule: x%g of the base)",
                     self.state.version, G, ",".join(f"{lr:g}" for lr in lrs), rule, factor)

    def _non_finite(self, task: pb.Task, start: int, end: int, *, loss: bool) -> None:
        """A step whose loss or gradient is NaN or infinite: nothing of it is applied. Raise (the job
        fails naming the step) or, with --nan-policy skip-step, drop it and go on."""
        what = f"{'loss' if loss else 'gradient'} of step {self.state.version + 1}"
        where = f"records [{start}, {end}) of {task.source} on this worker"
        if self.spec.training.nan_policy != "skip-step":
            raise NonFiniteError(f"the {what} is not finite ({where}); nothing of the step was applied "
                                 "(--nan-policy fail; skip-step drops such steps)")
        log.warning("skipped: the %s is not finite (%s); nothing of it is applied (--nan-policy skip-step)",
                    what, where)
        self.state.skipped_steps += 1

    def checkpoint(self, *, final: bool = False, stop: bool = False) -> Path:
        """Write model + optimizer state and tell the master where the round stands.

        A model with NaN or infinite weights is never written (the last good checkpoint stays
        the latest): a job must not succeed, nor resume, with one. An in-memory snapshot being
        persisted is waited for first (one waiting is dropped: this one is newer)."""
        if self.flash is not None:
            self.flash.drain(discard=True)
        path = checkpoint_path(self.spec.checkpoint_dir, self.state.version, final=final)
        tree = self.state_tree()
        if bad := nonfinite(tree["model"]):
            raise NonFiniteError(f"the model after step {self.state.version} has non-finite weights "
                                 f"({'; '.join(bad)}); {path.name} was not written")
        write_checkpoint(path, encode(tree))  # CheckpointWriteError (e.g. a full disk): the previous one stays
        self.client.report_checkpoint(str(path), self.state.position(), final=final, stop=stop)
        return path

    def _plan(self, task: pb.Task, j: int):
        """``(start, end, plan)``: this rank's records of step ``j`` and the step's plan."""
        step_start = task.start + j * task.global_batch_size
        step_size = min(task.global_batch_size, task.end - step_start)
        plan = plan_step(step_size, self.collective.world_size, self.max_micro_batch)
        lo, hi = plan.span(self.collective.rank)
        return step_start + lo, step_start + hi, plan

    def _load_span(self, task: pb.Task, start: int, end: int):
        key = (task.task_id, task.source)
        if self._reader is None or self._reader[0] != key:  # a task's reader is found once, not every step
            self._reader = key, task_reader(self.model_def, task.source, mode=Mode.TRAINING,
                                            data_origin=self.spec.data.training)
        records = self._reader[1](start, end)
        meta = FeedMetadata(task.source, start, end, task.epoch)
        return self.backend.feed(records, Mode.TRAINING, meta)

    def _compute(self, batch, plan, *, arm: bool = False) -> tuple[float, int]:
        """The step's micro-batches on this rank; ``arm``: the backend reduces buckets during the
        last one's backward (the earlier ones only accumulate)."""
        if batch is None:
            return 0.0, 0
        features, labels = batch
        rank = self.collective.rank
        lo, hi = plan.span(rank)
        loss_sum = 0.0
        slices = [(offset, size) for offset, size in plan.slices(rank) if size]
        for k, (offset, size) in enumerate(slices):
            if arm and k + 1 == len(slices):
                self.backend.arm(self.collective.start_sum)
            sl = slice(offset - lo, offset - lo + size)
            loss = self.backend.accumulate(features, labels, sl, scale=size / plan.global_batch)
            loss_sum += loss * size
        return loss_sum, hi - lo
