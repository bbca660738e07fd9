"""Launch backends: how the master starts, watches and stops its workers.

The master only ever talks to the :class:`LaunchBackend` interface. Two
implementations exist: :class:`LocalProcessBackend` (processes on this
machine; ``flextrain train`` on a laptop and every test) and the Kubernetes
pod backend. Both report the exit of an instance through the same callback,
so the master's membership logic is identical whatever runs the workers.
"""

from __future__ import annotations

import abc
import enum
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from flextrain.orphans import ENV_PARENT_PID, remove_alive_marks
from flextrain.zygote import Zygote, ZygoteGone


class Role(str, enum.Enum):
    WORKER = "worker"
    PS = "ps"


@dataclass(frozen=True)
class InstanceSpec:
    """One process/pod to run: identity, command line and extra environment."""

    instance_id: str
    role: Role
    index: int
    args: tuple[str, ...]  # arguments of the `flextrain` command
    env: Mapping[str, str] = field(default_factory=dict)
    spare: bool = False  # a spare worker (--spare-workers): parked until taken (flextrain/master/spares.py)
    avoid_nodes: tuple[str, ...] = ()  # nodes not to run on (a replaced straggler's, for a while)
    memory: str | None = None  # a pod's memory limit and request instead of its spec's (a memory ladder's rung)


@dataclass(frozen=True)
class PSEndpoint:
    """Where a parameter server listens (``listen_host:port``) and the ``address`` workers dial."""

    listen_host: str
    port: int
    address: str


ExitCallback = Callable[[str, int], None]


class LaunchBackend(abc.ABC):
    """Starts instances and reports each one's exit exactly once."""

    def __init__(self) -> None:
        self._on_exit: ExitCallback = lambda instance_id, code: None

    def on_exit(self, callback: ExitCallback) -> None:
        """Call ``callback(instance_id, exit_code)`` when an instance ends.

        Exit codes follow the shell convention: a process killed by signal N
        reports ``128 + N`` (SIGKILL: 137), as a Kubernetes container does.
        """
        self._on_exit = callback

    @abc.abstractmethod
    def launch(self, spec: InstanceSpec) -> None:
        """Start an instance; returns once it is started (not once it is ready)."""

    def promote(self, instance_id: str) -> None:
        """A spare was taken and is now a worker: make what shows it say so (a pod's label). The spare
        itself learns it from its Park poll; a local process needs nothing here."""

    def report(self, *, reason: str, message: str) -> None:
        """Something the user should see where the instances run (on Kubernetes an Event on the job;
        the job's status and log have it already, so nothing here by default)."""

    @abc.abstractmethod
    def terminate(self, instance_id: str, *, force: bool = False) -> None:
        """Ask an instance to stop (SIGTERM), or kill it (``force``)."""

    @abc.abstractmethod
    def running(self) -> set[str]:
        """Instances started and not yet seen exiting."""

    @abc.abstractmethod
    def close(self, *, grace: float = 5.0) -> None:
        """Stop every instance, waiting up to ``grace`` seconds before killing."""

    def log_location(self, instance_id: str) -> str:
        """Where a user finds an instance's output (a file, or the command that shows it)."""
        return ""

    def output_tail(self, instance_id: str) -> str:
        """The last lines an instance printed, once it has exited ("" where they cannot be had)."""
        return ""

    def disruption(self, instance_id: str) -> str | None:
        """Why the cluster took the instance away (preempted, evicted), when it did; None for a failure of
        its own or an instance the master stopped. Such an exit costs no relaunch budget. Processes on
        this machine are never preempted."""
        return None

    def exit_reason(self, instance_id: str) -> str:
        """Why an instance that exited was ended by its host, when known ("OOMKilled": over its memory
        limit); "" otherwise. Read by the master's judge of the exit."""
        return ""

    def ps_endpoint(self, index: int) -> PSEndpoint | None:
        """Where parameter server ``index`` must listen and how workers reach it, when the backend
        decides (pods behind Services); None: the PS picks a free loopback port and reports it
        through an address file (one host)."""
        return None


class LocalProcessBackend(LaunchBackend):
    """Each instance is a ``python -m flextrain ...`` child process.

    Output goes to ``<log_dir>/<instance_id>.log``. A thread per process
    waits on it, so exits are reported as soon as they happen (no polling).
    With a :class:`~flextrain.zygote.Zygote` each child is forked from it,
    torch already imported, unless its environment differs from the
    zygote's where that matters (then, or once the zygote is gone, a fresh
    process as without one).
    """

    def __init__(self, *, log_dir: Path, env: Mapping[str, str] | None = None,
                 worker_memory_limit: int | None = None, zygote: Zygote | None = None) -> None:
        """``worker_memory_limit``: bytes of resident memory a worker may use; one over it is killed
        and its exit reason is ``OOMKilled`` (flextrain/master/memwatch.py). None: no limit.
        ``zygote``: owned by the backend from here on (closed by :meth:`close`)."""
        super().__init__()
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.base_env = dict(os.environ if env is None else env)
        self.zygote = zygote
        self.forked = 0  # children forked from the zygote (the rest started fresh)
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._watch = None
        if worker_memory_limit is not None:
            from flextrain.master.memwatch import RssWatch

            self._watch = RssWatch(worker_memory_limit, kill=lambda iid: self.terminate(iid, force=True),
                                   watched=lambda: {i: p.pid for i, p in self._running_procs().items()
                                                    if i.startswith(Role.WORKER.value)})

    def _running_procs(self) -> dict[str, subprocess.Popen]:
        with self._lock:
            return dict(self._procs)

    def exit_reason(self, instance_id: str) -> str:
        return self._watch.reasons.get(instance_id, "") if self._watch is not None else ""

    def launch(self, spec: InstanceSpec) -> None:
        env = {**self.base_env, **spec.env, ENV_PARENT_PID: str(os.getpid())}
        with open(self.log_dir / f"{spec.instance_id}.log", "ab") as log:
            proc = self._forked(spec, env, log.fileno()) or subprocess.Popen(
                [sys.executable, "-m", "flextrain", *spec.args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the master only
            )
        with self._lock:
            self._procs[spec.instance_id] = proc
        threading.Thread(
            target=self._wait, args=(spec.instance_id, proc), daemon=True,
            name=f"wait-{spec.instance_id}",
        ).start()

    def _forked(self, spec: InstanceSpec, env: dict[str, str], log: int):
        """The child forked from the zygote, or None where it cannot be (start a fresh process)."""
        zygote = self.zygote
        if zygote is None or not zygote.serves(env):
            return None
        try:
            with open(os.devnull, "rb") as null:
                proc = zygote.spawn(spec.args, env={**env, ENV_PARENT_PID: str(zygote.pid)},
                                    stdin=null.fileno(), stdout=log, stderr=log)
        except ZygoteGone as exc:
            logging.getLogger("flextrain.launcher").warning("%s: %s starts as a fresh process", exc,
                                                            spec.instance_id)
            return None
        self.forked += 1
        return proc

    def _wait(self, instance_id: str, proc: subprocess.Popen) -> None:
        code = proc.wait()
        remove_alive_marks(proc.pid)  # a killed worker no peer watched leaves its mark behind
        with self._lock:
            self._procs.pop(instance_id, None)
        self._on_exit(instance_id, 128 - code if code < 0 else code)

    def log_location(self, instance_id: str) -> str:
        return str(self.log_dir / f"{instance_id}.log")

    def output_tail(self, instance_id: str) -> str:
        from flextrain.master.failures import log_tail

        return log_tail(self.log_dir / f"{instance_id}.log")

    def pid(self, instance_id: str) -> int | None:
        with self._lock:
            proc = self._procs.get(instance_id)
        return proc.pid if proc else None

    def terminate(self, instance_id: str, *, force: bool = False) -> None:
        with self._lock:
            proc = self._procs.get(instance_id)
        if proc is not None:
            try:
                proc.send_signal(signal.SIGKILL if force else signal.SIGTERM)
            except ProcessLookupError:
                pass

    def running(self) -> set[str]:
        with self._lock:
            return set(self._procs)

    def close(self, *, grace: float = 5.0) -> None:
        if self._watch is not None:
            self._watch.close()
        with self._lock:
            procs = dict(self._procs)
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.zygote is not None:
            self.zygote.close()
