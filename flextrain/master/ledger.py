"""The task ledger: dynamic data sharding with exactly-once accounting.

Shards (``source, start, end``) are cut into tasks of ``steps_per_task``
optimizer steps (``steps_per_task * G`` records; a shard's last task holds the
rest). Step ``j`` of a task covers records ``[start + j*G, start + (j+1)*G)``
whatever the number of workers, so "steps committed" maps to exact records.

A task is TODO, DOING (handed out) or DONE. When a task stops part-way — its
worker round broke, or a record could not be read — the committed steps count
as done and only the remainder goes back to the front of TODO. A remainder
that failed by its own fault (bad data) carries a retry count; past
``max_retries`` the ledger records the error and the job fails with it.

With a batch schedule (the G of each global optimizer step) a task's G is
decided at hand-out: the ledger knows the step the next hand-out starts at
(``next_step``: a round's starting model version, set by the master, then
advanced by each hand-out) and carves from the TODO range a run of at most
``steps_per_task`` steps of equal G; the rest stays in TODO. Records map to
steps by ``start + j*G`` as ever and a remainder is a plain record range,
so exactly-once is unchanged. A resumed round starts at its checkpoint's
version; an online schedule's decisions (``adaptive_batches``) persist here.

Epochs are created lazily: when nothing is TODO the next epoch's tasks are
cut (shuffled by ``seed + epoch`` when asked), even while the last tasks of
the current one are still DOING. So a worker never waits at an epoch's end
for the others to finish theirs, and an AllReduce round's rank 0 gets the
next epoch's first tasks with its ahead ask during the last task (no blocking
GetTask at every epoch boundary: 2.4% of a 2-worker digits worker's wall time
in a profile; the bench resolved no gain from it, bench/README.md).
Exactly-once is per record range, not per epoch: a remainder of an older
epoch goes back to the front of TODO as ever and is handed out first. The whole state is
plain data (``to_dict``/``from_dict``) so the master can persist and resume it.

Evaluation tasks cover the validation data for one model version each
(``cut_evaluation``), during training (``--evaluation-steps``) and at its end;
they carry no training progress and are not persisted: their partial metric
sums live in the master (``master/evaluation.py``), so after a restore an
unfinished evaluation is cut again. Prediction tasks cover the prediction
data once, in input order (task ids increase with the position of the
records), and are never split.

The tasks themselves are ``ledger_tasks.py``; the ledger as persisted data
(``to_dict``, ``check_state``, ``restore``) is ``ledger_state.py``.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Callable

from flextrain.data import Shard
from flextrain.elastic.schedule import BatchSchedule
from flextrain.master.ledger_state import LedgerPersistence
from flextrain.master.ledger_tasks import LedgerError, LedgerStateError, Task, TaskKind

__all__ = ["LedgerError", "LedgerStateError", "Task", "TaskKind", "TaskLedger"]



class TaskLedger(LedgerPersistence):
    def __init__(
        self,
        *,
        shards: list[Shard],
        epochs: int,
        global_batch_size: int,
        steps_per_task: int,
        shuffle: bool = False,
        seed: int = 0,
        max_retries: int = 3,
        evaluation_shards: list[Shard] | None = None,
        prediction_shards: list[Shard] | None = None,
        renew_ids: bool = False,
        schedule: BatchSchedule | None = None,
    ) -> None:
        """``renew_ids``: a training remainder put back in TODO gets a new task id (AllReduce,
        where a round's members report a task separately: a late report must not reach the
        next hand-out). ParameterServer keeps ids: the parameter servers dedupe pushes by id."""
        self.shards = list(shards)
        self.renew_ids = renew_ids
        self.schedule = schedule
        self.next_step = 0  # the global optimizer step the next training hand-out starts at (schedule)
        self.epochs = epochs
        self.global_batch_size = global_batch_size
        self.steps_per_task = steps_per_task
        self.shuffle = shuffle
        self.seed = seed
        self.max_retries = max_retries
        self.evaluation_shards = list(evaluation_shards or [])
        self.prediction_shards = list(prediction_shards or [])
        self.records_per_epoch = sum(s.size for s in self.shards)
        self.epoch = -1  # the epoch whose tasks were cut last
        self.todo: deque[Task] = deque()
        self.doing: dict[int, Task] = {}
        self.records_done = 0  # training records applied, over all epochs
        self.tasks_done = 0  # tasks completed by this master (metrics; not persisted)
        self.evaluation_cut = False  # the final evaluation (after training) was cut
        self.error: str | None = None
        self._next_id = 0
        # called before a task leaves DOING (the master resolves its in-memory snapshots then)
        self.before_outcome: Callable[[], None] | None = None
        self.todo.extend(self._cut(TaskKind.PREDICTION, self.prediction_shards, 0))
        # (task id, source, start, end) of every prediction task, in input order
        self.prediction_plan = [(t.task_id, t.source, t.start, t.end) for t in self.todo]

    # ---- sizes and progress -------------------------------------------------
    @property
    def records_total(self) -> int:
        return self.records_per_epoch * self.epochs

    def training_finished(self) -> bool:
        return (
            self.epoch >= self.epochs - 1
            and not any(t.kind is TaskKind.TRAINING for t in (*self.todo, *self.doing.values()))
        )

    # ---- cutting ------------------------------------------------------------
    def _new_task(self, kind: TaskKind, shard: Shard, start: int, end: int, epoch: int) -> Task:
        task = Task(self._next_id, kind, shard.source, start, end, epoch, self.global_batch_size)
        self._next_id += 1
        return task

    def _cut(self, kind: TaskKind, shards: list[Shard], epoch: int) -> list[Task]:
        per_task = self.steps_per_task * self.global_batch_size
        if self.schedule is not None and kind is TaskKind.TRAINING:  # carved to their steps' G at hand-out (_fit):
            # whole shards, so only a shard's end makes a step short of its G (shuffled: pieces of the largest G)
            per_task = (self.steps_per_task * max(self.schedule.sizes) if self.shuffle
                        else max([1, *(s.size for s in shards)]))
        tasks = []
        for shard in shards:
            for start in range(shard.start, shard.end, per_task):
                tasks.append(self._new_task(kind, shard, start, min(start + per_task, shard.end), epoch))
        return tasks

    def _start_next_epoch(self) -> bool:
        if self.epoch >= self.epochs - 1:
            return False
        self.epoch += 1
        tasks = self._cut(TaskKind.TRAINING, self.shards, self.epoch)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(tasks)
        self.todo.extend(tasks)
        return True

    # ---- hand-out -----------------------------------------------------------
    def next_training_task(self, owner: str) -> Task | None:
        """The next training task, or None when none is available now.

        Use :meth:`training_finished` to tell "none now" from "none ever".
        """
        if self.error:
            return None
        if not self.todo:  # (the last tasks of this epoch may still be DOING: see the module docstring)
            self._start_next_epoch()
        for i, task in enumerate(self.todo):
            if task.kind is TaskKind.TRAINING:
                del self.todo[i]
                if self.schedule is not None:
                    self._fit(task, at=i)
                task.owner = owner
                self.doing[task.task_id] = task
                return task
        return None

    def _fit(self, task: Task, *, at: int) -> None:
        """Make ``task`` the next ``next_step`` steps of one G (at most ``steps_per_task``); the rest
        of its records go back to TODO position ``at`` (where it was) for later hand-outs."""
        G, run = self.schedule.hand_out(self.next_step, epoch=task.epoch, max_steps=self.steps_per_task)
        if task.size > run * G:
            rest = Task(self._next_id, task.kind, task.source, task.start + run * G, task.end, task.epoch, G,
                        retries=task.retries)
            self._next_id += 1
            self.todo.insert(at, rest)
            task.end = task.start + run * G
        task.global_batch_size = G
        self.next_step += task.steps

    def trim(self, task_id: int, size: int) -> None:
        """Keep only the first ``size`` records in DOING task ``task_id`` (a slow worker's share); the rest
        goes back to the front of TODO as a task of its own."""
        task = self.doing[task_id]
        if not 0 < size < task.size:
            return
        rest = Task(self._next_id, task.kind, task.source, task.start + size, task.end, task.epoch,
                    task.global_batch_size, retries=task.retries)
        self._next_id += 1
        self.todo.appendleft(rest)
        task.end = task.start + size

    def cut_evaluation(self, model_version: int) -> int:
        """Queue tasks evaluating the model at ``model_version`` on the validation data; how many."""
        tasks = self._cut(TaskKind.EVALUATION, self.evaluation_shards, self.epoch)
        for task in tasks:
            task.model_version = model_version
        self.todo.extend(tasks)
        return len(tasks)

    def next_evaluation_task(self, owner: str, model_version: int | None = None) -> Task | None:
        """The next evaluation task of ``model_version``; without one, of the final evaluation.

        The final evaluation is cut on the first such call (at ``model_version`` 0
        unless :meth:`cut_evaluation` cut it and set ``evaluation_cut``).
        """
        if model_version is None and not self.evaluation_cut:
            self.evaluation_cut = True
            self.cut_evaluation(0)
        return self._take(TaskKind.EVALUATION, owner,
                          lambda t: model_version is None or t.model_version == model_version)

    def next_prediction_task(self, owner: str) -> Task | None:
        return self._take(TaskKind.PREDICTION, owner, lambda t: True)

    def _take(self, kind: TaskKind, owner: str, accept) -> Task | None:
        if self.error:
            return None
        for i, task in enumerate(self.todo):
            if task.kind is kind and accept(task):
                del self.todo[i]
                task.owner = owner
                self.doing[task.task_id] = task
                return task
        return None

    def pending(self, kind: TaskKind, model_version: int | None = None) -> list[Task]:
        """TODO and DOING tasks of ``kind`` (evaluation: of ``model_version`` when given)."""
        return [t for t in (*self.todo, *self.doing.values())
                if t.kind is kind and (model_version is None or t.model_version == model_version)]

    def evaluation_finished(self) -> bool:
        return self.evaluation_cut and not self.pending(TaskKind.EVALUATION)

    def prediction_finished(self) -> bool:
        return not self.pending(TaskKind.PREDICTION)

    # ---- outcomes -----------------------------------------------------------
    def complete(self, task_id: int) -> Task:
        if self.before_outcome is not None:
            self.before_outcome()
        task = self.doing.pop(task_id)
        self.tasks_done += 1  # (this master's count: not persisted)
        if task.kind is TaskKind.TRAINING:
            self.records_done += task.size
        return task

    def interrupt(self, task_id: int, steps_done: int) -> Task:
        """Its worker(s) went away: keep committed steps, requeue the rest as is."""
        return self._split(task_id, steps_done, failed=False, error="")

    def fail(self, task_id: int, steps_done: int, error: str) -> Task:
        """The task itself failed (e.g. corrupt data): requeue the rest with a retry."""
        return self._split(task_id, steps_done, failed=True, error=error)

    def _split(self, task_id: int, steps_done: int, *, failed: bool, error: str) -> Task:
        if self.before_outcome is not None:
            self.before_outcome()
        task = self.doing.pop(task_id)
        applied = task.records_in_steps(steps_done) if task.kind is TaskKind.TRAINING else 0
        self.records_done += applied
        if failed and self.schedule is not None and task.kind is TaskKind.TRAINING:
            # Its round goes on without the failed steps: later hand-outs start that much earlier.
            self.next_step -= max(0, task.steps - max(0, steps_done))
        if applied >= task.size:
            return task
        task.start += applied
        task.owner = ""
        if self.renew_ids and task.kind is TaskKind.TRAINING:
            # A report still naming the old hand-out (a slower member of the round that failed
            # it) must find nothing, not the next hand-out, whose records it would count as applied.
            task.task_id, self._next_id = self._next_id, self._next_id + 1
        if failed:
            task.retries += 1
            if task.retries > self.max_retries:
                # The job fails, but the task's records stay owed (first in TODO: the error stops every
                # hand-out), so the ledger saved with the failure keeps them and --resume trains them.
                self.error = (
                    f"{task.kind.value} task {task.task_id} ({task.source} records "
                    f"[{task.start}, {task.end})) failed {task.retries} times; last error: {error}"
                )
        self.todo.appendleft(task)
        return task

    def release_owner(self, owner: str) -> list[Task]:
        """Requeue whole every DOING task of ``owner`` (nothing of them applied)."""
        lost = [t for t in self.doing.values() if t.owner == owner]
        for task in lost:
            self.interrupt(task.task_id, 0)
        return lost
