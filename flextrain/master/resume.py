"""What ``flextrain train --resume DIR`` may change, where a moved job directory is, and the job's history.

Contract:

* A resume continues the job stored in ``DIR/jobspec.json``. The settings in
  :data:`CHANGEABLE` may be given again with a new value and are applied
  (:func:`resumed_spec`); any other setting given with ``--resume`` is refused
  (:class:`ResumeSpecError` naming every such flag), because it would change
  what the stored checkpoints and task ledger mean (the data, the batch, the
  task boundaries, the strategy) or it is not the resume's to choose (the
  directory itself). Nothing is dropped in silence.
* The stored ``job_dir`` is re-rooted at ``DIR`` with every stored path under
  it (data or outputs kept inside the job directory), so a moved or copied
  directory resumes from its own checkpoints, never from the recorded
  location; :attr:`Resumed.moved_from` says where it was recorded.
* Every run of a job directory appends one line to ``DIR/history.jsonl``
  (:func:`record_run`): when, which process, start / resume / overwrite, the
  settings a resume changed and a location it moved from.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from flextrain.job import SETTING, JobSpec, JobSpecError, Strategy, flag_of
from flextrain.master.checkpoints import CheckpointStore

HISTORY_FILE = "history.jsonl"

# The settings a resume may change (by JobSpec path), and why each is safe to change mid-job.
CHANGEABLE = {
    "worker.replicas": "the planner re-splits the fixed global batch for any number of workers",
    "worker.min_replicas": "as --workers",
    "worker.max_replicas": "as --workers",
    "training.epochs": "more epochs extend the job (fewer than stored are refused)",
    "training.learning_rate": "the optimizer is rebuilt with it (AllReduce; the parameter servers keep theirs)",
    "data.validation": "evaluation tasks are never persisted",
    "training.evaluation_steps": "as --validation-data",
    "training.max_micro_batch": "only how a step is split into micro-batches, not its samples",
    "training.memory_limit": "as --max-micro-batch (auto's bound)",
    "training.checkpoint_steps": "when checkpoints are taken",
    "training.memory_checkpoint_steps": "when in-memory checkpoints are taken",
    "training.memory_checkpoint_persist_every": "which in-memory checkpoints are also written to disk",
    "training.memory_checkpoint_persist_seconds": "as --memory-checkpoint-persist-every",
    "training.bucket_mb": "only how the reduction of a step's gradients is cut, not what it sums",
    "ps.ps_checkpoint_steps": "when the parameter servers checkpoint",
    "metrics": "only whether the master serves /metrics",
    "metrics_port": "only where the master serves /metrics",
    "tls": "every run of the master makes the job's CA, certificate and token afresh",
    "ps.ps_wal_fsync": "how the parameter servers flush their log from now on (what is logged is the same)",
    "worker.rendezvous_timeout": "a timeout",
    "worker.worker_timeout": "a timeout",
    "worker.start_timeout": "a timeout",
    "worker.min_workers_timeout": "a timeout",
    "worker.relaunch_budget": "a budget of this run",
    "worker.memory_limit": "a limit this run's master enforces",
    "worker.spares": "spares are started ahead and are not workers: no step depends on them",
    "training.max_task_retries": "a budget of this run",
    "training.nan_policy": "what the next non-finite step does",
    "training.preflight": "a check before the run",
    "training.tensorboard": "only whether the master writes TensorBoard files from now on",
}
_PATH_FIELDS = ("training_data", "validation_data", "checkpoint", "prediction_data", "output")


class ResumeSpecError(JobSpecError):
    """A resume asked for something it cannot do; the message names the flags."""


@dataclass(frozen=True)
class Resumed:
    spec: JobSpec
    changes: tuple[str, ...] = ()  # "--epochs 3 -> 5", in flag order
    moved_from: str | None = None  # the job_dir recorded in jobspec.json, when it is not this one


def load_stored(job_dir: str | Path) -> JobSpec:
    """The JobSpec stored in a job directory; ResumeSpecError naming the file when there is none."""
    path = Path(job_dir) / "jobspec.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ResumeSpecError(f"--resume {job_dir}: {path} not found (not a flextrain job directory)") from None
    except OSError as exc:
        raise ResumeSpecError(f"--resume {job_dir}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return JobSpec.from_json(text)
    except (ValueError, TypeError) as exc:
        raise ResumeSpecError(f"--resume {job_dir}: {path} is damaged: {exc}") from None


def resumed_spec(job_dir: str | Path, given: dict[str, object], *, refused: tuple[str, ...] = ()) -> Resumed:
    """The stored spec re-rooted at ``job_dir`` with the ``given`` JobSpec fields applied.

    ``given`` maps setting keys (``workers``, see ``flextrain.job.SETTINGS``) to the values the user gave; ``refused``
    names flags the caller already knows a resume cannot take (not JobSpec
    fields). Raises ResumeSpecError naming every flag that cannot change.
    """
    root = str(Path(job_dir).resolve())
    stored = load_stored(job_dir)
    moved_from = stored.job_dir if stored.job_dir and stored.job_dir != root else None
    rerooted = {"job_dir": root}
    if moved_from:  # stored paths under the old location now lie under this one
        for field in _PATH_FIELDS:
            value = stored.get(field)
            if value:
                rerooted[field] = ",".join(reroot(part, moved_from, root) for part in value.split(","))
    spec = stored.replace(**rerooted)
    # A setting given again with the job's own value changes nothing (a command line run again as it was)
    given = {f: v for f, v in given.items() if f in SETTING and SETTING[f].path in CHANGEABLE or
             f not in SETTING or v != spec.get(f)}
    bad = [*refused, *(flag_of(f) for f in given if f not in SETTING or SETTING[f].path not in CHANGEABLE)]
    if bad:
        raise ResumeSpecError(
            f"{', '.join(bad)} cannot change on --resume: the stored checkpoints and task ledger were made "
            f"with the job's own value{'s' if len(bad) > 1 else ''} (see {Path(job_dir) / 'jobspec.json'}); "
            f"start a new job for that (another --job-dir, or --overwrite). A resume may change: "
            + ", ".join(flag_of(f) for f in CHANGEABLE))
    if "epochs" in given and isinstance(given["epochs"], int) and given["epochs"] < stored.training.epochs:
        raise ResumeSpecError(f"--epochs {given['epochs']} is fewer than the job's {stored.training.epochs}: "
                              "a resume may extend training, not shorten it")
    if "learning_rate" in given and stored.strategy is Strategy.PARAMETER_SERVER:
        raise ResumeSpecError("--lr cannot change on --resume of a ParameterServer job: the parameter servers "
                              "restore the optimizer they were checkpointed with")
    changes = tuple(f"--no-{f}" if f in ("preflight", "tensorboard") and not v
                    else f"{flag_of(f)} {_shown(spec.get(f))} -> {_shown(v)}"
                    for f, v in given.items() if v != spec.get(f))
    return Resumed(spec.replace(**given), changes, moved_from)


def reroot(path: str, old: str, new: str) -> str:
    """``path`` moved from under ``old`` to under ``new``; a path outside ``old`` is returned as it is."""
    if path == old or path.startswith(old.rstrip("/") + "/"):
        return new.rstrip("/") + path[len(old.rstrip("/")):]
    return path


def reroot_ledger(state: dict, old: str, new: str) -> dict:
    """A persisted ledger state whose task sources (data files) under ``old`` now lie under ``new``."""
    todo = state.get("todo")
    if not isinstance(todo, list):
        return state  # the ledger's own check names what is wrong with it
    return {**state, "todo": [{**t, "source": reroot(t["source"], old, new)}
                              if isinstance(t, dict) and isinstance(t.get("source"), str) else t for t in todo]}


def restore(job, store: CheckpointStore, *, moved_from: str | None = None) -> str | None:
    """Take over a resumed job's saved state through its strategy; None, or why it cannot resume.
    A job that finished training is refused unless its epochs were extended."""
    root = job.spec.job_dir
    return job.strategy.restore(job, store, relocate=lambda state: reroot_ledger(state, moved_from, root)
                                if moved_from else state)


def _shown(value) -> str:
    return "(unset)" if value is None else str(value)


def record_run(job_dir: str | Path, run: str, *, changes: tuple[str, ...] = (), moved_from: str | None = None,
               previous: str | None = None) -> dict:
    """Append one line to ``DIR/history.jsonl`` and return it; an OSError (a full disk) passes."""
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "run": run, "pid": os.getpid(),
             "host": socket.gethostname(), "jobDir": str(Path(job_dir).resolve())}
    if changes:
        entry["changes"] = list(changes)
    if moved_from:
        entry["movedFrom"] = moved_from
    if previous:
        entry["previous"] = previous
    with open(Path(job_dir) / HISTORY_FILE, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return entry


def read_history(job_dir: str | Path) -> list[dict]:
    """The runs recorded in ``DIR/history.jsonl``, oldest first (lines that do not parse are skipped)."""
    try:
        lines = (Path(job_dir) / HISTORY_FILE).read_text().splitlines()
    except OSError:
        return []
    runs = []
    for line in lines:
        try:
            runs.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in runs if isinstance(r, dict)]


__all__ = ["CHANGEABLE", "HISTORY_FILE", "ResumeSpecError", "Resumed", "load_stored", "read_history",
           "record_run", "reroot", "reroot_ledger", "restore", "resumed_spec"]
