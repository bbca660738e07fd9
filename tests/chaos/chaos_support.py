"""The chaos driver: a real `flextrain train` job of a counting model, SIGKILLed and scaled while it runs.

Each event waits for the one before to have taken effect (a newcomer training), observing the
job's status.json, its processes and the marks its workers leave (FT_FEED_MARKS); nothing waits
for a duration. The counting models' FT_FEED_DELAY (a stand-in for compute) makes a job outlast
its chaos (about 20 s on the 2-core development machine, much more when it is loaded); a job that
ends before its chaos is over fails the test, with its output. Once the chaos is over
(:meth:`ChaosJob.finish`) the delay is lifted (FT_FEED_DELAY_UNTIL): the rest of the job trains at
full speed, so a generous delay costs little.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

from ft_helpers import alive, command_line, flextrain_cmd, read_status, run_flextrain, wait_for

TIMEOUT = 120  # seconds any one event may wait for its state: a hang, not a threshold
RECORDS = 512  # training records of the counting models: 16 steps of G=32 per epoch


def pids_with(*needles: str) -> dict[int, list[str]]:
    """Processes whose command line holds every one of ``needles`` as an argument: pid -> argv."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = command_line(entry.name)
            except OSError:
                continue
            if all(n in argv for n in needles):
                out[int(entry.name)] = argv
    return out


class ChaosJob:
    """``flextrain train ARGS`` in the background; events are applied as it runs."""

    def __init__(self, job_dir: Path, args: list[str], *, env: dict[str, str], seed: int) -> None:
        self.job_dir, self.rng, self.kills = job_dir, random.Random(seed), []
        self.t0 = time.monotonic()
        self.log = job_dir.with_name(f"{job_dir.name}.out")  # a file, not a pipe nobody drains while it runs
        self.marks = job_dir.with_name(f"{job_dir.name}.marks")  # FT_FEED_MARKS: who has trained
        self.marks.mkdir()
        self.calm = job_dir.with_name(f"{job_dir.name}.calm")  # FT_FEED_DELAY_UNTIL: the chaos is over
        env = {"FT_FEED_MARKS": str(self.marks), "FT_FEED_DELAY_UNTIL": str(self.calm), **env}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(flextrain_cmd("train", *args, "--job-dir", str(job_dir)),
                                         stdout=out, stderr=subprocess.STDOUT, text=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **env})

    def running(self) -> dict | None:
        """The status while the job runs; AssertionError (with its output) once it has ended."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the job ended (code {self.proc.returncode}) before the chaos was over:\n"
                                 f"{self.output()[-3000:]}")
        path = self.job_dir / "status.json"
        status = read_status(self.job_dir) if path.exists() else None
        return status if status and status["phase"] == "Running" else None

    def when(self, predicate, *, what: str):
        """The first truthy ``predicate(status)`` while the job runs."""
        return wait_for(lambda: (s := self.running()) and predicate(s), timeout=TIMEOUT, what=what)

    def note(self, event: str) -> None:
        """Print what happened when (shown with the output of a failing test)."""
        status = self.running() or {"progress": {"percent": "?"}}
        print(f"{time.monotonic() - self.t0:6.1f}s {status['progress']['percent']:>5}% {event}")

    # ---- AllReduce ------------------------------------------------------------------
    @staticmethod
    def live_round(s: dict, *, size: int = 2) -> dict | None:
        """The latest round if it has at least ``size`` members and every one is alive."""
        last = s["roundHistory"][-1] if s["roundHistory"] else None
        members = last["members"] if last else []
        return last if len(members) >= size and all(alive(m["pid"]) for m in members) else None

    def joined(self, before: dict, *, size: int = 1, what: str) -> dict:
        """The first live round after ``before`` with someone new in it (and ``size`` members)."""
        old = {m["id"] for m in before["members"]}
        found = self.when(lambda s: (r := self.live_round(s, size=size)) and r["round"] > before["round"]
                          and {m["id"] for m in r["members"]} - old and r, what=what)
        self.note(f"round {found['round']}: {[m['id'] for m in found['members']]}")
        return found

    def kill_member(self, *, rank: int | None = None) -> None:
        """SIGKILL a member (``rank``, else a random one) of a live round of two or more (the
        last member standing would take the round's state with it) once it has trained a few
        steps (the group formed, the state broadcast); wait for its replacement."""
        victims = self.when(lambda s: (r := self.live_round(s)) and s["step"] > r["version"] + 3 and r,
                            what="a round of two or more live members training")
        victim = victims["members"][rank] if rank is not None else self.rng.choice(victims["members"])
        os.kill(victim["pid"], signal.SIGKILL)
        self.kills.append(victim["id"])
        self.note(f"killed {victim['id']} (rank {victims['members'].index(victim)})")
        self.joined(victims, what=f"the replacement of {victim['id']}")

    def scale_round(self, workers: int) -> None:
        """``flextrain scale`` to ``workers``, then wait for a round that large."""
        before = self.when(lambda s: self.live_round(s, size=1), what="a live round")
        self.scale(workers)
        self.joined(before, size=workers, what=f"a round of {workers} after scaling")

    # ---- ParameterServer ------------------------------------------------------------
    @staticmethod
    def worker_processes(s: dict) -> dict[str, int]:
        """This job's live worker processes: worker id -> pid."""
        return {argv[argv.index("--worker-id") + 1]: pid
                for pid, argv in pids_with("worker", "--master", s["masterAddress"]).items()
                if "--worker-id" in argv[:-1]}

    def training_workers(self, s: dict) -> dict[str, int]:
        """Live workers that have trained (their first ``feed`` left a mark): worker id -> pid."""
        marked = {p.name for p in self.marks.iterdir()}
        return {wid: pid for wid, pid in self.worker_processes(s).items() if wid in marked}

    def new_worker(self, known: set[str], *, what: str) -> None:
        """Wait for a worker training that is none of the ``known`` ones."""
        found = self.when(lambda s: set(self.training_workers(s)) - known, what=what)
        self.note(f"{what}: {sorted(found)} training")

    def known_workers(self) -> set[str]:
        """Every worker started so far, alive or not (a started worker leaves its log)."""
        return {p.stem for p in (self.job_dir / "logs").glob("worker-*.log")} | set(
            self.worker_processes(self.running() or {"masterAddress": "?"}))

    def kill_worker(self) -> None:
        """SIGKILL a random training worker; wait for a new one to train."""
        live = self.when(lambda s: len(self.training_workers(s)) >= 2 and self.training_workers(s),
                         what="two training workers")
        victim = self.rng.choice(sorted(live))
        known = self.known_workers()
        os.kill(live[victim], signal.SIGKILL)
        self.kills.append(victim)
        self.note(f"killed {victim}")
        self.new_worker(known, what=f"the replacement of {victim}")

    def scale_workers(self, workers: int) -> None:
        """``flextrain scale`` to ``workers``, then wait for a new worker to train."""
        self.when(self.training_workers, what="a training worker")
        known = self.known_workers()
        self.scale(workers)
        self.new_worker(known, what=f"a worker started by scaling to {workers}")

    def kill_ps(self, index: int) -> None:
        """SIGKILL ps-``index``; wait until it is relaunched and training has moved on."""
        address_file = str(self.job_dir / "ps" / f"ps-{index}.addr")
        (pid,) = self.when(lambda s: list(pids_with(address_file)), what=f"ps-{index}")
        os.kill(pid, signal.SIGKILL)
        self.kills.append(f"ps-{index}")
        self.note(f"killed ps-{index}")
        self.when(lambda s: [p for p in pids_with(address_file) if p != pid], what=f"ps-{index} relaunched")
        done = self.running()["progress"]["recordsDone"]
        self.when(lambda s: s["progress"]["recordsDone"] > done, what=f"training after ps-{index} came back")
        self.note(f"ps-{index} relaunched, training goes on")

    # ---- both ---------------------------------------------------------------------------
    def scale(self, workers: int) -> None:
        done = run_flextrain("scale", str(self.job_dir), str(workers))
        assert done.returncode == 0, done.stderr
        self.note(f"scaled to {workers}")

    def output(self) -> str:
        return self.log.read_text()

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        """The chaos is over: lift the feed delay, wait for the job to end: (exit code, its output).
        Killed if it outlives ``timeout``."""
        self.calm.touch()
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, self.output()
