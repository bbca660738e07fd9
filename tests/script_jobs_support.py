"""Script jobs (`flextrain run` of examples/elastic_script_torch.py) for the tests of several areas.

The example script appends a line to JOB_DIR/script-log.jsonl each time it starts (round, world size,
rank, the step it restored, its micro-batch and accumulation steps, G) and each time rank 0 commits, so
tests see what every incarnation of the script did. :func:`scale_up_and_kill` runs the one job that
tests/scriptjobs (the script's own state) and tests/observability (the job's history) both read.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ft_helpers import REPO, finish, flextrain_cmd, read_status, run_flextrain, wait_for

SCRIPT = str(REPO / "examples" / "elastic_script_torch.py")
G, M = 64, 16


def start(job_dir, *flags, script_args=()):
    cmd = flextrain_cmd("run", "--job-dir", str(job_dir), "--no-progress", *flags, SCRIPT,
                        "--global-batch-size", str(G), "--max-micro-batch", str(M), *script_args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def records(job_dir, event=None):
    path = job_dir / "script-log.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in lines if event is None or r["event"] == event]


def running_round(job_dir, members):
    """The latest round, once it has ``members`` members and every one's script has started in it."""
    if not (job_dir / "status.json").exists():
        return None
    history = read_status(job_dir)["roundHistory"]
    if not history or len(history[-1]["members"]) != members:
        return None
    rnd = history[-1]
    started = [r for r in records(job_dir, "start") if r["round"] == rnd["round"]]
    return rnd if len(started) == members else None


def committed_after(job_dir, step, world):
    return [c for c in records(job_dir, "commit") if c["step"] > step and c["world_size"] == world]


def reported_losses(job_dir, after: float = 0.0) -> list[dict]:
    """The history's ``metrics`` records with a loss, later than ``after`` (a time)."""
    from flextrain.master.history import read_events

    path = job_dir / "events.jsonl"
    return [r for r in read_events(path) if r["type"] == "metrics" and r["loss"] is not None
            and r["time"] > after] if path.exists() else []


@dataclass
class ScaledAndKilled:
    """What :func:`scale_up_and_kill` saw: the rounds of 1, of 2 and of 2 after the kill, the step the
    pair restored, the killed member, and the outputs of the commands it ran."""

    job_dir: Path
    first: dict
    pair: dict
    again: dict
    restored: int
    victim: dict
    scaled: subprocess.CompletedProcess
    shown: subprocess.CompletedProcess
    code: int
    err: str


def scale_up_and_kill(job_dir: Path) -> ScaledAndKilled:
    """A 150-step script job on 1 worker (a commit every 5 steps), scaled to 2, one of the pair SIGKILLed;
    each event waits for the one before to have taken effect (the script re-formed and committing). It
    then runs to its end."""
    proc = start(job_dir, "--workers", "1", "--min-workers", "1", "--max-workers", "2",
                 script_args=("--steps", "150", "--commit-every", "5", "--step-seconds", "0.1"))
    try:
        first = wait_for(lambda: running_round(job_dir, 1), timeout=120, what="the script running on 1 worker")
        wait_for(lambda: committed_after(job_dir, 0, 1), timeout=60, what="a commit in a world of 1")

        scaled = run_flextrain("scale", str(job_dir), "2")
        pair = wait_for(lambda: (r := running_round(job_dir, 2)) and r["round"] > first["round"] and r,
                        timeout=120, what="the script re-formed on 2 workers")
        restored = [r for r in records(job_dir, "start") if r["round"] == pair["round"]][0]["step"]
        wait_for(lambda: committed_after(job_dir, restored, 2), timeout=60, what="a commit in a world of 2")
        shown = run_flextrain("status", str(job_dir), "--json")

        victim = pair["members"][1]
        os.kill(victim["pid"], signal.SIGKILL)
        again = wait_for(lambda: (r := running_round(job_dir, 2)) and r["round"] > pair["round"] and r,
                         timeout=120, what="the script re-formed after a killed worker")
        code, err = finish(proc)
    finally:
        proc.kill()
    return ScaledAndKilled(job_dir, first, pair, again, restored, victim, scaled, shown, code, err)
