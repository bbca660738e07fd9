"""A script job's worker: an agent that runs the user's script in each round's world.

What torchrun's agent does, with flextrain's master as the rendezvous and
the job's owner. The agent registers, then for every round:

1. joins the rendezvous (``JoinRendezvous``) and learns the round: id, its
   rank, the world size, the round's own TCPStore (``store_host:store_port``);
2. starts the script (``flextrain/worker/script_child.py``) with torchrun's
   environment — ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK=0``,
   ``LOCAL_WORLD_SIZE=1``, ``MASTER_ADDR``/``MASTER_PORT`` (the round's store;
   ``TORCHELASTIC_USE_AGENT_STORE=True`` so rank 0 connects to it rather than
   binding it), ``TORCHELASTIC_RESTART_COUNT`` (the round id) — plus
   ``FLEXTRAIN_JOB_DIR``, ``FLEXTRAIN_STATE_DIR`` (where
   ``flextrain.elastic.state.State`` commits), ``FLEXTRAIN_ROUND`` and
   ``FLEXTRAIN_PROGRESS_FILE`` (where ``flextrain.elastic.progress`` appends
   the script's steps and losses);
3. heartbeats while it runs, carrying the progress the script appended since
   the last one (the job's history, TensorBoard and status show it). When the master ends the round (a member
   died, a worker joined or was scaled away) the agent terminates the script
   (SIGTERM to its process group, SIGKILL after ``CHILD_GRACE``) and joins
   the next round, where the script starts again from its last commit.

How the script ended decides what follows:

* exit 0: the agent says so (a ``GetTask``, see
  ``flextrain/master/script_strategy.py``) and exits 0 once every member's
  script finished; if the round ends first, the script runs again;
* a failure while the round ends anyway (a peer died and the script's
  collective failed with it): not the script's fault, the agent joins the
  next round;
* a failure while the round stays: the script's own. The agent reports it —
  the script's exception, file:line and traceback from the failure file
  ``script_child`` writes — and exits with its code, so the master fails the
  job with the script's error as its reason when it repeats with no commit
  in between (the rule of module jobs);
* killed by a signal (OOM, ...): the agent exits ``128 + signal`` unreported,
  an infrastructure failure the master relaunches.

The position the agent reports carries the number of commits the script
made (``version``): "no step in between" means "no commit in between".
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flextrain.elastic.progress import ENV_PROGRESS_FILE, ProgressReader
from flextrain.elastic.state import COMMIT_FILE, ENV_STATE_DIR
from flextrain.failures import ExitCode, FailureKind
from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.client import MasterClient
from flextrain.worker.script_child import ENV_FAILURE_FILE

log = logging.getLogger("flextrain.worker")

CHILD_GRACE = 5.0  # seconds a terminated script has to exit before it is killed
PEER_GRACE = 10.0  # how long a failed script waits for the master to end its round (a peer died)
POLL = 0.2  # seconds between asks while waiting for the round to end or the other scripts to finish
STATE_DIR = "state"  # under the job directory (flextrain/master/script_strategy.py STATE_DIR)


_RUN, _END, _STOP = "run", "end_round", "stop"


@dataclass(frozen=True)
class RoundInfo:
    round_id: int
    rank: int
    world_size: int
    store_host: str
    store_port: int


def script_env(spec: JobSpec, rnd: RoundInfo, *, worker_id: str, failure_file: str,
               progress_file: str = "") -> dict[str, str]:
    """The script's environment in ``rnd``: torchrun's variables and flextrain's."""
    job_dir = str(Path(spec.job_dir).resolve())
    env = {
        "WORLD_SIZE": str(rnd.world_size), "RANK": str(rnd.rank), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rnd.rank), "ROLE_RANK": str(rnd.rank), "ROLE_WORLD_SIZE": str(rnd.world_size),
        "MASTER_ADDR": rnd.store_host, "MASTER_PORT": str(rnd.store_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(rnd.round_id),
        "TORCHELASTIC_RUN_ID": spec.name,
        "FLEXTRAIN_JOB_DIR": job_dir, ENV_STATE_DIR: str(Path(job_dir) / STATE_DIR),
        "FLEXTRAIN_ROUND": str(rnd.round_id), "FLEXTRAIN_WORKER_ID": worker_id, ENV_FAILURE_FILE: failure_file,
        **({ENV_PROGRESS_FILE: progress_file} if progress_file else {}),
    }
    threads = os.environ.get("FLEXTRAIN_NUM_THREADS", "0")
    if threads != "0" and "OMP_NUM_THREADS" not in os.environ:  # the cores the master gave this worker
        env["OMP_NUM_THREADS"] = threads
    return env


def commits(spec: JobSpec) -> int:
    """How many times the script committed its state (0 before the first commit)."""
    try:
        return int(json.loads((Path(spec.job_dir) / STATE_DIR / COMMIT_FILE).read_text())["commit"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class ScriptAgent:
    def __init__(self, client: MasterClient, spec: JobSpec, *, worker_id: str, heartbeat_interval: float) -> None:
        self.client, self.spec, self.worker_id = client, spec, worker_id
        self.interval = heartbeat_interval
        self.round_id = -1
        self.child: subprocess.Popen | None = None
        self.failure_file = Path(tempfile.mkdtemp(prefix="flextrain-script-")) / "failure.pb"
        # The script's progress (flextrain.elastic.progress), one file for every round's script: read on.
        self.progress = ProgressReader(self.failure_file.with_name("progress.jsonl"))

    def position(self) -> pb.Position:
        return pb.Position(round_id=self.round_id, version=commits(self.spec))

    def run(self) -> int:
        """Rounds until the job is over for this worker; returns the exit code."""
        (Path(self.spec.job_dir) / STATE_DIR).mkdir(parents=True, exist_ok=True)
        self.client.register(pid=os.getpid())
        previous = signal.signal(signal.SIGTERM, _raise_exit)  # a terminated agent takes its script along
        try:
            return self._rounds()
        except SystemExit as exc:  # SIGTERM: the master closes the job or removes this worker
            if isinstance(exc.code, int) and exc.code >= 128:
                return exc.code
            raise
        finally:
            self._terminate()
            signal.signal(signal.SIGTERM, previous)

    def _rounds(self) -> int:
        reason = "start"
        while True:
            resp = self.client.join(self.position(), reason)
            if resp.action == pb.JoinRendezvousResponse.STOP:
                return ExitCode.OK
            if resp.action == pb.JoinRendezvousResponse.WAIT:
                continue
            rnd = RoundInfo(resp.round_id, resp.rank, resp.world_size, resp.store_host, resp.store_port)
            self.round_id = rnd.round_id
            log.info("round %d: rank %d of %d; starting %s", rnd.round_id, rnd.rank, rnd.world_size,
                     self.spec.script)
            self._start(rnd)
            outcome, code = self._watch()
            if outcome == _STOP:
                return ExitCode.OK
            if outcome == _END:
                reason = "round_changed"
                continue
            if code == 0:
                outcome = self._await_others()
                if outcome == _STOP:
                    return ExitCode.OK
                reason = "round_changed"
                continue
            if self._round_ends():
                log.warning("round %d: the script exited with code %d as its round ended (a peer left)",
                            rnd.round_id, code)
                reason = "collective_failed"
                continue
            return self._failed(code)

    def _start(self, rnd: RoundInfo) -> None:
        self.failure_file.unlink(missing_ok=True)
        env = {**os.environ, **script_env(self.spec, rnd, worker_id=self.worker_id,
                                          failure_file=str(self.failure_file), progress_file=str(self.progress.path))}
        self.child = subprocess.Popen(
            [sys.executable, "-m", "flextrain.worker.script_child", self.spec.script, *self.spec.script_args],
            env=env, stdin=subprocess.DEVNULL, start_new_session=True)  # its own group: terminated as one

    def _watch(self) -> tuple[str, int]:
        """Heartbeat until the script exits or the round ends: (_RUN, exit code) or (_END | _STOP, 0)."""
        while True:
            try:
                code = self.child.wait(timeout=self.interval)
            except subprocess.TimeoutExpired:
                code = None
            loss, samples, step = self.progress.take()
            if code is not None:
                if samples or step:  # the steps it reported since the last heartbeat: the job's last ones
                    self.client.heartbeat(self.position(), loss, samples, step=step)
                return _RUN, code
            resp = self.client.heartbeat(self.position(), loss, samples, step=step)
            if resp.stop or resp.job_over:
                self._terminate()
                return _STOP, 0
            if resp.end_round:
                log.info("round %d ends: stopping the script", self.round_id)
                self._terminate()
                return _END, 0

    def _await_others(self) -> str:
        """The script exited 0: wait for the other members' (_STOP: the job is done) or the round's end."""
        while True:
            resp = self.client.get_task(round_id=self.round_id, task_index=0, position=self.position())
            if resp.action in (pb.GetTaskResponse.NO_MORE, pb.GetTaskResponse.STOP):
                return _STOP
            if resp.action == pb.GetTaskResponse.END_ROUND:
                return _END
            time.sleep(POLL)  # polling the master: the others finish in their own time

    def _round_ends(self) -> bool:
        """Whether the master ends this round within PEER_GRACE (a peer died: the script's failure follows)."""
        deadline = time.monotonic() + PEER_GRACE
        while time.monotonic() < deadline:
            resp = self.client.heartbeat(self.position(), 0.0, 0)
            if resp.end_round or resp.stop or resp.job_over:
                return True
            time.sleep(POLL)  # polling the master: a dead peer's exit reaches it in its own time
        return False

    def _failed(self, code: int) -> int:
        """The script failed on its own: report its error; the exit code says which kind it was."""
        if code < 0:  # killed by a signal we did not send: the node's doing (OOM, ...); relaunched
            log.error("the script was killed by signal %d", -code)
            return 128 - code
        try:
            failure = pb.Failure.FromString(self.failure_file.read_bytes())
        except (OSError, ValueError):  # os._exit() or a crash in native code: no failure file
            failure = pb.Failure(kind=FailureKind.USER_CODE.value, exit_code=int(ExitCode.USER_CODE),
                                 message=f"the script {self.spec.script} exited with code {code} "
                                         "(its output is in this worker's log)")
        failure.stage, failure.step = "running the script", commits(self.spec)
        log.error("the script failed: %s: %s", failure.exception or "exit", failure.message)
        self.client.report_failure(failure)
        return failure.exit_code or ExitCode.USER_CODE

    def _terminate(self) -> None:
        child, self.child = self.child, None
        if child is None or child.poll() is not None:
            return
        try:
            os.killpg(child.pid, signal.SIGTERM)
            child.wait(timeout=CHILD_GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        except ProcessLookupError:
            child.wait()


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run_agent(client: MasterClient, spec: JobSpec, *, worker_id: str, heartbeat_interval: float) -> int:
    """Run a script job's worker (see the module docstring); returns its exit code."""
    return ScriptAgent(client, spec, worker_id=worker_id, heartbeat_interval=heartbeat_interval).run()


__all__ = ["COMMIT_FILE", "STATE_DIR", "RoundInfo", "commits", "run_agent", "script_env"]
