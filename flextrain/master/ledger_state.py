"""The task ledger as plain data: what the master persists and a resumed master takes over.

A mixin of :class:`flextrain.master.ledger.TaskLedger`, apart for size: ``to_dict``
(DOING tasks go back to TODO, evaluations are cut again), ``snapshot`` (the
ledger of a model that applied exactly up to a position), ``check_state`` (a
persisted ledger that cannot belong to this job is refused, naming the field)
and ``restore``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import fields

from flextrain.master.ledger_tasks import LedgerStateError, Task, TaskKind

# A task's fields are plain values: read directly, what ``dataclasses.asdict`` (a deep copy, ~4x the
# CPU) gives; the ledger is turned into a dict for every checkpoint and in-memory snapshot.
_TASK_FIELDS = tuple(f.name for f in fields(Task))


class LedgerPersistence:
    # ---- persistence --------------------------------------------------------
    def to_dict(self) -> dict:
        def task_dict(t: Task) -> dict:
            return {**{name: getattr(t, name) for name in _TASK_FIELDS}, "kind": t.kind.value}

        return {
            "epoch": self.epoch,
            "records_done": self.records_done,
            "next_id": self._next_id,
            # Evaluations are not persisted (see the module docstring): cut again after a restore.
            "evaluation_cut": False,
            # DOING tasks go back to TODO on restore: a resumed job re-runs them.
            "todo": [task_dict(t) for t in (*self.doing.values(), *self.todo)
                     if t.kind is not TaskKind.EVALUATION],
            # an online schedule's decisions (--batch-schedule adaptive): a resumed job goes on with them
            **({"schedule": self.schedule.state()} if hasattr(self.schedule, "state") else {}),
        }

    def snapshot(self, *, done_task: int | None = None, partial: tuple[int, int] | None = None) -> dict:
        """The ledger as it stands for a model that applied exactly up to a position.

        A checkpoint is taken at a step boundary; by the time the master hears
        of it the round may have moved on by at most that boundary: the task
        the checkpoint finished (``done_task``) may still be DOING, or the task
        it is inside (``partial = (task_id, steps_done)``) is DOING. Other
        DOING tasks were not started by that model and go back to TODO whole.
        """
        state = self.to_dict()
        todo = []
        for entry in state["todo"]:
            if entry["task_id"] == done_task and entry["task_id"] in self.doing:
                state["records_done"] += entry["end"] - entry["start"]
                continue
            if partial is not None and entry["task_id"] == partial[0] and entry["task_id"] in self.doing:
                applied = self.doing[partial[0]].records_in_steps(partial[1])
                state["records_done"] += applied
                entry = {**entry, "start": entry["start"] + applied}
                if entry["start"] >= entry["end"]:
                    continue
            todo.append(entry)
        state["todo"] = todo
        return state

    def check_state(self, state: dict) -> None:
        """Refuse (:class:`LedgerStateError`, naming the field) a persisted ledger that cannot
        belong to this job: epoch beyond the epochs, more records done than the job has, a task
        of an unknown source or outside its records, a malformed entry."""
        def integer(value, field: str) -> int:
            if not isinstance(value, int) or isinstance(value, bool):
                raise LedgerStateError(f"{field} is {value!r}, not an integer")
            return value

        if not isinstance(state, dict):
            raise LedgerStateError(f"the ledger is a {type(state).__name__}, not an object")
        for field in ("epoch", "records_done", "next_id", "todo"):
            if field not in state:
                raise LedgerStateError(f"field {field!r} is missing")
        epoch = integer(state["epoch"], "epoch")
        if not -1 <= epoch <= self.epochs - 1:
            raise LedgerStateError(f"epoch is {epoch}, beyond the job's {self.epochs} epoch(s) "
                                   f"(counted from 0: at most {self.epochs - 1})")
        done = integer(state["records_done"], "records_done")
        if not 0 <= done <= self.records_total:
            raise LedgerStateError(f"records_done is {done}, but the job has {self.records_total} records "
                                   f"({self.records_per_epoch} per epoch, {self.epochs} epoch(s))")
        next_id = integer(state["next_id"], "next_id")
        if next_id < 0:
            raise LedgerStateError(f"next_id is {next_id}")
        if not isinstance(state["todo"], list):
            raise LedgerStateError("todo is not a list")
        shards = {TaskKind.TRAINING.value: self.shards, TaskKind.PREDICTION.value: self.prediction_shards,
                  TaskKind.EVALUATION.value: self.evaluation_shards}
        fields = set(Task.__dataclass_fields__)
        required = {"task_id", "kind", "source", "start", "end", "epoch", "global_batch_size"}
        for i, task in enumerate(state["todo"]):
            where = f"todo[{i}]"
            if not isinstance(task, dict) or not required <= set(task) <= fields:
                raise LedgerStateError(f"{where} is not a task (fields {sorted(fields)})")
            if task["kind"] not in shards:
                raise LedgerStateError(f"{where}.kind is {task['kind']!r}")
            for field in ("task_id", "start", "end", "epoch", "global_batch_size", "retries", "model_version"):
                if field in task:
                    integer(task[field], f"{where}.{field}")
            if not any(s.source == task["source"] for s in shards[task["kind"]]):
                raise LedgerStateError(f"{where}.source {task['source']!r} is not a source of the job's "
                                       f"{task['kind']} data")
            if not any(s.source == task["source"] and s.start <= task["start"] < task["end"] <= s.end
                       for s in shards[task["kind"]]):
                raise LedgerStateError(f"{where} records [{task['start']}, {task['end']}) are not within "
                                       f"the records of {task['source']}")
            if task["kind"] == TaskKind.TRAINING.value and not 0 <= task["epoch"] <= epoch:
                raise LedgerStateError(f"{where}.epoch is {task['epoch']}, the ledger's epoch {epoch}")
            if task["global_batch_size"] <= 0:
                raise LedgerStateError(f"{where}.global_batch_size is {task['global_batch_size']}")
        if hasattr(self.schedule, "parse_state"):
            try:
                self.schedule.parse_state(state.get("schedule"))
            except (ValueError, TypeError, KeyError) as exc:
                raise LedgerStateError(f"schedule: {exc}") from None

    def restore(self, state: dict) -> None:
        """Take over a persisted state (:meth:`to_dict`); :meth:`check_state` refuses one that does not fit."""
        self.check_state(state)
        self.epoch = state["epoch"]
        self.records_done = state["records_done"]
        self._next_id = state["next_id"]
        self.evaluation_cut = False
        if hasattr(self.schedule, "restore"):
            self.schedule.restore(state.get("schedule"))  # checked by check_state
        self.doing.clear()
        self.todo = deque(
            Task(**{**t, "kind": TaskKind(t["kind"]), "owner": ""}) for t in state["todo"]
            if t["kind"] != TaskKind.EVALUATION.value
        )
