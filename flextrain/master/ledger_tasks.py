"""What the task ledger hands out and records: tasks, their kinds, and the ledger's errors
(``flextrain.master.ledger``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TaskKind(str, enum.Enum):
    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


@dataclass
class Task:
    task_id: int
    kind: TaskKind
    source: str
    start: int
    end: int
    epoch: int
    global_batch_size: int
    retries: int = 0
    owner: str = ""  # worker id (evaluation) or "round-N" (training) while DOING
    model_version: int = 0  # EVALUATION: the model version (optimizer steps) evaluated

    @property
    def size(self) -> int:
        return self.end - self.start

    def records_in_steps(self, steps: int) -> int:
        return min(self.size, max(0, steps) * self.global_batch_size)

    @property
    def steps(self) -> int:
        return -(-self.size // self.global_batch_size)


class LedgerError(RuntimeError):
    """The job cannot go on: a task failed more often than allowed."""


class LedgerStateError(ValueError):
    """A persisted ledger does not fit the job's data; the message names the field."""
