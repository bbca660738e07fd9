"""Processes of one bench/rescale run: start them marked, wait with a bound, kill them all at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

PY = sys.executable
MARKER = "RESCALE_RUN"  # every process we start inherits MARKER=<run id>: how leftovers are found


def log(msg: str) -> None:
    print(f"[rescale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Timeout(Exception):
    pass


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Janitor:
    """Tracks the processes this run starts; ``cleanup`` kills them and their descendants."""

    def __init__(self) -> None:
        self.run_id = uuid.uuid4().hex
        self.popens: list[subprocess.Popen] = []
        self.logs: list = []

    def env(self, **extra: str) -> dict:
        return {**os.environ, MARKER: self.run_id, "PYTHONUNBUFFERED": "1", **extra}

    def start(self, cmd: list[str], *, env: dict, log_path: Path) -> subprocess.Popen:
        out = open(log_path, "ab")
        self.logs.append(out)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # its own process group: killpg reaches its children
        self.popens.append(proc)
        return proc

    def marked_pids(self) -> list[int]:
        """Live processes that inherited this run's marker (workers live in their own sessions)."""
        needle = f"{MARKER}={self.run_id}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    def cleanup(self) -> None:
        for proc in self.popens:
            if proc.poll() is None:
                kill_group(proc.pid)
        for pid in self.marked_pids():
            kill_pid(pid)
        for proc in self.popens:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"process {proc.pid} did not exit after SIGKILL")
        deadline = time.monotonic() + 10
        while (left := self.marked_pids()) and time.monotonic() < deadline:
            for pid in left:
                kill_pid(pid)
            time.sleep(0.1)
        for f in self.logs:
            f.close()


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
