"""TensorBoard event files of a job, written by the master from its history records.

A listener of :class:`flextrain.master.history.HistoryRecorder`: every record
the job's history gets is turned into TensorBoard summaries under
``<job-dir>/tensorboard/`` (``--no-tensorboard`` / ``training.tensorboard:
false`` turns it off). Scalars are by the job's global step, with the
record's wall time:

* ``train/loss``, ``train/learning_rate`` (when ``--lr`` set it; else
  ``train/lr_factor``), ``train/global_batch``, ``train/samples_per_second``,
  ``train/workers``, ``train/workers_desired`` from ``metrics`` records;
* ``eval/<name>`` from ``evaluation`` records;
* membership (rounds, joins, leaves, failures, relaunches, scales, phases) as
  text under the tag ``membership``.

A restarted master writes a new event file in the same directory (TensorBoard
reads them as one run); only records new to the history are written, so
nothing is doubled.
"""

from __future__ import annotations

from pathlib import Path

TENSORBOARD_DIR = "tensorboard"

_SCALARS = (("loss", "train/loss"), ("lr", "train/learning_rate"), ("lrFactor", "train/lr_factor"),
            ("globalBatch", "train/global_batch"), ("samplesPerSecond", "train/samples_per_second"),
            ("workers", "train/workers"), ("desired", "train/workers_desired"))


def membership_text(rec: dict) -> str | None:
    """One line for a membership record (None: the record is not one)."""
    kind = rec["type"]
    if kind == "round":
        return f"round {rec['round']} formed at step {rec['version']}: {', '.join(rec['members'])}"
    if kind in ("join", "leave"):
        return f"{rec['worker']} {'joined' if kind == 'join' else 'left'} in round {rec['round']} ({rec['why']})"
    if kind == "failure":
        return f"{rec['worker']} {rec['why']}: {rec.get('detail', '')}"
    if kind == "relaunch":
        return f"{rec['worker']} launched to replace {rec['replaces']}"
    if kind == "launch":
        return f"{rec['worker']} launched"
    if kind == "scale":
        return f"desired workers {rec['previous']} -> {rec['desired']}"
    if kind == "phase":
        return f"phase {rec['phase']}" + (f": {rec['message']}" if rec.get("message") else "")
    if kind == "start":
        return "master resumed the job" if rec.get("resume") else "master started"
    return None


class TensorBoardWriter:
    """Writes history records as TensorBoard summaries (see the module docstring)."""

    def __init__(self, job_dir: str | Path) -> None:
        from tensorboardX import SummaryWriter  # only a job that writes TensorBoard files imports it

        self.log_dir = Path(job_dir) / TENSORBOARD_DIR
        self._writer = SummaryWriter(logdir=str(self.log_dir), flush_secs=10)
        self._step = 0  # the latest global step seen: membership text is placed there

    def __call__(self, rec: dict) -> None:
        walltime = rec["time"]
        if rec["type"] == "metrics":
            self._step = rec["step"]
            for key, tag in _SCALARS:
                if rec.get(key) is not None:
                    self._writer.add_scalar(tag, rec[key], rec["step"], walltime=walltime)
        elif rec["type"] == "evaluation":
            for name, value in rec["metrics"].items():
                if value is not None:
                    self._writer.add_scalar(f"eval/{name}", value, rec["step"], walltime=walltime)
        elif (text := membership_text(rec)) is not None:
            self._step = max(self._step, rec.get("version", 0))
            self._writer.add_text("membership", text, self._step, walltime=walltime)

    def close(self) -> None:
        self._writer.close()


__all__ = ["TENSORBOARD_DIR", "TensorBoardWriter", "membership_text"]
