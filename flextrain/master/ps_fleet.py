"""PSFleet: the job's parameter servers, launched and kept alive by the master.

ParameterServer strategy only. :meth:`PSFleet.start` launches ``spec.ps.replicas``
processes (``flextrain --log-level INFO ps --shard-index I --num-ps N ...``, instance ids
``ps-I``, :class:`~flextrain.master.launcher.Role.PS`) through the job's
launch backend, each writing its ``host:port`` to
``<job_dir>/ps/ps-I.addr`` and checkpointing to ``<job_dir>/ps-checkpoints``
every ``spec.ps.ps_checkpoint_steps`` versions (with a write-ahead log unless
``spec.ps.ps_wal`` is off: ``--no-wal``; ``spec.ps.ps_wal_fsync``: ``--wal-fsync``); it returns the addresses once
every file exists (workers get them with the JobSpec).

With a backend that places parameter servers itself (pods behind Services:
``LaunchBackend.ps_endpoint``), PS ``I`` listens on the host and port the
backend gives and workers get the backend's address for it (the Service);
:meth:`start` returns once each accepts connections there.

A PS that exits while the job runs is relaunched on the same port, so its
address stays valid: workers' PS clients retry and reconnect by themselves,
and the new process restores the shard's newest checkpoint before it listens.
Exits are reported by the backend through :meth:`exited` (the master routes
``ps-*`` instance ids here). Each PS slot has ``relaunch_budget`` relaunches;
past it ``on_failure`` is called with the reason (the master fails the job).

A job that is not resumed starts its PS from nothing: the master has moved
an earlier run's state in the same job directory aside to
``<job_dir>/previous-<time>/`` (never deleted; flextrain/master/jobdir.py)
before the fleet starts. A resumed job's PS restore theirs (checkpoint +
write-ahead log).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

import grpc

from flextrain.job import JobSpec
from flextrain.master.launcher import InstanceSpec, LaunchBackend, PSEndpoint, Role
from flextrain.protocol.limits import PS_MESSAGE_OPTIONS
from flextrain.protocol.security import JobCredentials, open_channel

log = logging.getLogger(__name__)

PS_PREFIX = "ps-"


class PSStartError(RuntimeError):
    """A parameter server did not come up (its log file is named)."""


def is_ps(instance_id: str) -> bool:
    return instance_id.startswith(PS_PREFIX)


class PSFleet:
    def __init__(self, backend: LaunchBackend, spec: JobSpec, *, relaunch_budget: int,
                 on_note: Callable[[str], None] = lambda message: None,
                 on_failure: Callable[[str], None] = lambda message: None,
                 start_timeout: float = 60.0, resume: bool = False, creds: JobCredentials | None = None,
                 env: dict[str, str] | None = None) -> None:
        """``creds``/``env``: --tls, the job's material (to dial the servers) and where they find it."""
        self.creds, self.env = creds, dict(env or {})
        self.backend = backend
        self.spec = spec
        self.relaunch_budget = relaunch_budget
        self.start_timeout = start_timeout
        self._on_note, self._on_failure = on_note, on_failure
        self.address_dir = Path(spec.job_dir) / "ps"
        self.addresses: list[str] = []
        self.endpoints: list[PSEndpoint | None] = []  # by index; None: loopback + address file
        self.relaunches = [0] * spec.ps.replicas
        self.resume = resume
        self.closed = False
        self._lock = threading.Lock()

    @property
    def ids(self) -> set[str]:
        return {f"{PS_PREFIX}{i}" for i in range(self.spec.ps.replicas)}

    def _address_file(self, index: int) -> Path:
        return self.address_dir / f"{PS_PREFIX}{index}.addr"

    def _launch(self, index: int, port: int) -> None:
        spec = self.spec
        endpoint = self.endpoints[index]
        where = (("--host", "127.0.0.1", "--address-file", str(self._address_file(index))) if endpoint is None
                 else ("--host", endpoint.listen_host, "--advertise-host", endpoint.address.rsplit(":", 1)[0]))
        args = ("--log-level", "INFO", "ps", "--shard-index", str(index), "--num-ps", str(spec.ps.replicas), "--port", str(port),
                *where, "--checkpoint-dir", str(spec.ps_checkpoint_dir),
                "--checkpoint-every", str(spec.ps.ps_checkpoint_steps),
                "--mode", spec.ps.ps_mode, "--grads-to-wait", str(spec.ps.effective_grads_to_wait),
                "--torch-threads", "1", "--threads", str(16 + 4 * spec.worker.effective_max_replicas),
                *(() if spec.ps.ps_wal else ("--no-wal",)),
                *(("--wal-fsync",) if spec.ps.ps_wal and spec.ps.ps_wal_fsync else ()))
        self.backend.launch(InstanceSpec(f"{PS_PREFIX}{index}", Role.PS, index, args,
                                         {"PYTHONUNBUFFERED": "1", **self.env}))

    def start(self) -> list[str]:
        """Launch every PS and wait until it listens; returns the addresses by shard index."""
        try:
            self.endpoints = [self.backend.ps_endpoint(i) for i in range(self.spec.ps.replicas)]
        except (RuntimeError, ValueError) as exc:  # LaunchError (the API refused a Service), a bad annotation
            raise PSStartError(f"parameter servers cannot be placed: {exc}") from None
        self.address_dir.mkdir(parents=True, exist_ok=True)
        for i, endpoint in enumerate(self.endpoints):
            self._address_file(i).unlink(missing_ok=True)
            self._launch(i, 0 if endpoint is None else endpoint.port)
        deadline = time.monotonic() + self.start_timeout
        pending = set(range(self.spec.ps.replicas))
        while pending:
            for i in sorted(pending):
                if self._listening(i):
                    pending.discard(i)
            if not pending:
                break
            gone = [i for i in pending if f"{PS_PREFIX}{i}" not in self.backend.running()]
            if gone or time.monotonic() > deadline:
                why = "exited" if gone else f"did not listen within {self.start_timeout:.0f}s"
                i = (gone or sorted(pending))[0]
                raise PSStartError(f"parameter server {i} {why}; see {Path(self.spec.job_dir) / 'logs'}/"
                                   f"{PS_PREFIX}{i}.log")
            time.sleep(0.05)
        self.addresses = [self._address_file(i).read_text().strip() if e is None else e.address
                          for i, e in enumerate(self.endpoints)]
        return list(self.addresses)

    def _listening(self, index: int) -> bool:
        endpoint = self.endpoints[index]
        if endpoint is None:
            path = self._address_file(index)
            return path.is_file() and bool(path.read_text().strip())
        # Placed by the backend: the PS listens once it restored its shard; connecting says so.
        with open_channel(endpoint.address, self.creds, options=PS_MESSAGE_OPTIONS) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=0.5)
            except grpc.FutureTimeoutError:
                return False
        return True

    def exited(self, instance_id: str, code: int) -> None:
        """Backend callback for a ``ps-*`` instance: relaunch it on its port while the job runs."""
        index = int(instance_id[len(PS_PREFIX):])
        with self._lock:
            if self.closed or not self.addresses:
                return
            self.relaunches[index] += 1
            over = self.relaunches[index] > self.relaunch_budget
        if over:
            self._on_failure(f"parameter server {index} exited with code {code} "
                             f"{self.relaunches[index]} times, over the relaunch budget of {self.relaunch_budget}")
            return
        endpoint = self.endpoints[index]
        port = endpoint.port if endpoint is not None else int(self.addresses[index].rsplit(":", 1)[1])
        self._on_note(f"parameter server {index} exited with code {code}: relaunching it on port {port} "
                      "from its latest checkpoint")
        log.warning("ps-%d exited with code %d; relaunching on port %d", index, code, port)
        self._launch(index, port)

    def close(self) -> None:
        """Stop relaunching; SIGTERM every PS (each writes a final checkpoint before it exits)."""
        with self._lock:
            self.closed = True
        for instance_id in self.ids:
            self.backend.terminate(instance_id)
