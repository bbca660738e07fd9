"""A pre-forked zygote: local children start with torch already imported.

Every local worker, parameter server and preflight is ``python -m flextrain ...``, and each one used
to spend ~3.7 s of CPU importing torch (and ``torch._dynamo``, which building an optimizer imports)
before doing anything of its own: most of a local job's start, with three to five such processes
sharing a laptop's cores. The zygote is one process that imports them once and forks a child per
launch; the child then runs ``python -m MODULE ARGS`` as a fresh process would (``runpy``), with its
own arguments, environment, directory, standard streams, session and exit code (which the zygote
reports to its owner) and, through ``setproctitle``, its own command line in ps.

The contract, and why it holds:

* Only third-party modules are loaded ahead (:data:`PRELOAD`, and a framework's own once the owner
  knows the job needs it: :meth:`Zygote.preload`, e.g. TensorFlow for a Keras job, ~8 s of CPU per
  worker here). flextrain's modules and the user's module are imported by the child, after its
  environment is in place, as in a fresh process.
* A child's environment may differ from the zygote's in anything but the variables read while
  those modules load or the interpreter starts (:data:`IMPORT_TIME`: ``PYTHON*``, ``OMP_*``, ...):
  :meth:`Zygote.serves` says no to such an environment and the caller starts a fresh process.
* The zygote forks from its only Python thread and never runs a torch operation (no OpenMP pool,
  no CUDA context), the conditions under which torch's own forked DataLoader workers are safe;
  nor a TensorFlow one (its runtime, once started, is not fork-safe: tensorflow/tensorflow#5448;
  importing it only starts an idle thread).
* The zygote exits once its owner's end of the socket closes (the owner exited or closed it); a
  child in flight then sees its parent change and exits (flextrain/orphans.py), as when a master
  dies. A child's ``FLEXTRAIN_PARENT_PID`` is therefore the zygote's pid.
* Only JSON and file descriptors (``SCM_RIGHTS``) cross the socket: nothing is pickled.

``FLEXTRAIN_ZYGOTE=0`` turns it off (every child a fresh process). Hand-written because the
standard library's fork server (``multiprocessing.forkserver``) runs Python callables it unpickles,
not command lines with their own environment and streams, and reports no exit codes.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Mapping

log = logging.getLogger("flextrain.zygote")

ENV_SWITCH = "FLEXTRAIN_ZYGOTE"  # "0": no zygote
# torch._dynamo: torch imports it for the first optimizer any process builds (~1.9 s here, as much as torch)
PRELOAD = ("numpy", "torch", "torch.nn", "torch.optim", "torch.distributed", "torch._dynamo", "grpc",
           "google.protobuf.message", "setproctitle")
# Variables the interpreter or the preloaded libraries read as they start (a child cannot change them)
IMPORT_TIME = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "MALLOC_", "GLIBC_", "TORCH",
               "PYTORCH", "CUDA", "NVIDIA", "GRPC_", "PROTOCOL_BUFFERS", "NPY_", "NUMPY_", "LC_", "LANG")
# What a framework's children import beyond PRELOAD (Zygote.preload), the variables set for the import as
# the children set them before theirs, and the prefixes of those its import reads
FRAMEWORKS = {"tensorflow": (("tensorflow",), {"TF_CPP_MIN_LOG_LEVEL": "2"}, ("TF_", "KERAS_"))}
MAX_MESSAGE = 1 << 20  # bytes of one JSON message (a spawn request carries an environment)
STREAMS = (0, 1, 2)
READY_TIMEOUT = 300.0  # seconds a zygote may take to import (a hang, not a threshold: ~4 s here)
TITLE_ROOM = 2048  # characters of a child's command line that ps shows (a longer one is cut)


class ZygoteGone(RuntimeError):
    """The zygote exited (or never started): start a fresh process instead."""


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def _send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, len(STREAMS))
    return (json.loads(data) if data else None), fds


# ---- the owner's side ------------------------------------------------------------------------------
class ForkedProcess:
    """A child of the zygote, with the part of :class:`subprocess.Popen`'s interface the launchers use.
    ``returncode`` is Popen's: the exit status, or ``-N`` when signal N ended it."""

    def __init__(self, pid: int, args: tuple[str, ...]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not yet reaped by the zygote: the pid is still this child's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The owner's handle on a zygote process: :meth:`start` it early (it imports while the owner
    works), :meth:`spawn` children through it, :meth:`close` it at the end."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, env: Mapping[str, str]) -> None:
        self.proc, self.pid, self.env = proc, proc.pid, dict(env)
        self._sock = sock
        self._lock = threading.Lock()  # one request in flight: a spawn's answer is the next one
        self._cond = threading.Condition()
        self._ready = False
        self._gone = False
        self._answer: dict | None = None
        self._children: dict[int, ForkedProcess] = {}
        # What the zygote's imports found or put in its environment where the owner's had nothing: TensorFlow
        # sets KMP_* as it loads, and a child does the same; an owner that imported it has them too
        self._made: dict[str, str] = {}
        self._loading = 0  # preloads asked for and not yet reported done
        self.preloaded: tuple[str, ...] = ()  # the frameworks asked for with preload()
        self._early_exits: dict[int, int] = {}  # a child's exit can be read before its spawn's answer is handled
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    @classmethod
    def start(cls, *, env: Mapping[str, str] | None = None) -> Zygote | None:
        """Start a zygote with ``env`` (default: this process's), or None when turned off or it cannot
        start (the caller starts fresh processes)."""
        env = dict(os.environ if env is None else env)
        if not enabled() or env.get(ENV_SWITCH, "1") == "0":
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A child's title (its command line in ps) is written over the zygote's arguments, not
            # over its environment (SPT_NOENV): blank room for it at their end
            proc = subprocess.Popen([sys.executable, "-m", "flextrain.zygote", str(theirs.fileno()), " " * TITLE_ROOM],
                                    pass_fds=(theirs.fileno(),), env={**env, "SPT_NOENV": "1"},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            log.warning("no zygote (%s): every child starts as a fresh process", exc)
            ours.close()
            return None
        finally:
            theirs.close()
        return cls(proc, ours, env)

    @classmethod
    def for_local_job(cls) -> Zygote | None:
        """A zygote for a local job's children: the launchers give them this process's environment,
        unbuffered (flextrain/master/launcher.py, flextrain/worker/preflight.py)."""
        return cls.start(env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def ready(self) -> bool:
        """Whether the zygote has loaded: a :meth:`spawn` now would not wait for its imports."""
        return self._ready and not self._gone

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a child with ``env`` can be forked: no variable read at import time differs (from
        what the zygote's imports saw, or set themselves, as a fresh child's would). Waits for a
        preload in progress (a spawn would wait for it too)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._loading or self._gone, timeout=READY_TIMEOUT)
            if self._gone or self._loading:
                return False
            made = dict(self._made)
        keys = set(env) | set(self.env)

        def seen(e: Mapping[str, str], k: str) -> str | None:
            return e.get(k, made.get(k))

        read = IMPORT_TIME + tuple(p for framework in self.preloaded for p in FRAMEWORKS[framework][2])
        return not any(seen(env, k) != seen(self.env, k) for k in keys if k.startswith(read))

    def preload(self, framework: str) -> None:
        """Have the zygote import ``framework`` (a key of :data:`FRAMEWORKS`) too, for the children forked
        from now on; it imports in the background and a :meth:`spawn` meanwhile waits for it. A child
        whose environment differs in what that import reads is not served from then on. Once only."""
        modules, defaults, _ = FRAMEWORKS[framework]
        with self._cond:  # not self._lock: a spawn waiting for the zygote's first imports holds that
            if framework in self.preloaded or self._gone:
                return
            try:
                _send(self._sock, {"preload": list(modules), "defaults": defaults})
            except OSError:
                return  # gone: spawn says so
            self.preloaded += (framework,)  # serves() compares what its import reads from now on
            self._loading += 1

    def spawn(self, args: tuple[str, ...], *, env: Mapping[str, str], stdin: int, stdout: int, stderr: int,
              new_session: bool = True, module: str = "flextrain", cwd: str | None = None) -> ForkedProcess:
        """Fork ``python -m MODULE ARGS`` with ``env`` and the given standard streams (file
        descriptors, duplicated into the child), in ``cwd`` (default: this process's). Waits for the
        zygote to have loaded; ZygoteGone if it has exited."""
        with self._lock:
            with self._cond:
                if not self._cond.wait_for(lambda: self._ready or self._gone, timeout=READY_TIMEOUT):
                    self._gone = True  # stuck importing: not worth waiting for (the caller starts fresh processes)
                    self.proc.kill()
                    raise ZygoteGone(f"the zygote did not load torch within {READY_TIMEOUT:g}s")
                if self._gone:
                    raise ZygoteGone("the zygote has exited")
                self._answer = None
                try:
                    _send(self._sock, {"module": module, "args": list(args), "env": dict(env),
                                       "session": new_session, "cwd": cwd or os.getcwd()}, (stdin, stdout, stderr))
                except OSError as exc:
                    raise ZygoteGone(f"the zygote has exited ({exc})") from None
                self._cond.wait_for(lambda: self._answer is not None or self._gone)
                if self._answer is None:
                    raise ZygoteGone("the zygote exited while forking")
                if "error" in self._answer:
                    raise ZygoteGone(f"the zygote could not fork: {self._answer['error']}")
                child = ForkedProcess(self._answer["pid"], args)
                self._children[child.pid] = child
                if child.pid in self._early_exits:
                    child._exited(self._early_exits.pop(child.pid))
                return child

    def _read(self) -> None:
        while True:
            try:
                message, fds = _recv(self._sock)
            except (OSError, ValueError):
                message, fds = None, []
            for fd in fds:
                os.close(fd)
            with self._cond:
                if message is None:  # the zygote exited: its children follow it (flextrain/orphans.py)
                    self._gone = True
                    orphans = [c for c in self._children.values() if c.returncode is None]
                    self._cond.notify_all()
                    break
                if "ready" in message or "preloaded" in message:
                    self._ready = True
                    self._made.update({k: v for k, v in message["environ"].items() if k not in self.env})
                    self._loading -= "preloaded" in message
                elif "exit" in message:
                    child = self._children.pop(message["exit"], None)
                    if child is None:
                        self._early_exits[message["exit"]] = message["code"]
                    else:
                        child._exited(message["code"])
                else:
                    self._answer = message
                self._cond.notify_all()
        for child in orphans:
            _wait_gone(child)

    def close(self) -> None:
        """End the zygote at once, even mid-import (its running children are the caller's to stop first;
        any left exit on their own, as orphans do)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self.proc.poll() is None:
            self.proc.kill()  # nothing of the zygote's own is worth an orderly exit
        self.proc.wait()


def _wait_gone(child: ForkedProcess) -> None:
    """A child whose zygote exited: it exits within a second (its parent changed); report code 1 then."""
    try:
        fd = os.pidfd_open(child.pid)
    except OSError:  # already gone
        child._exited(1)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)
    child._exited(1)


# ---- the zygote's side -----------------------------------------------------------------------------
def serve(sock: socket.socket) -> dict:
    """Fork a child per request until the owner closes the socket (then exit). Returns only in a
    child: its request, with its streams already in place."""
    try:
        request, fds, children = _serve(sock)
    except OSError:  # the owner is gone (a refused job closes it at once): nothing to report to anyone
        os._exit(0)
    _become(sock, request, fds, children)  # an error here is the child's: its traceback, its exit code
    return request


def _serve(sock: socket.socket) -> tuple[dict, list[int], dict[int, int]]:
    children: dict[int, int] = {}  # pidfd -> pid
    _send(sock, {"ready": os.getpid(), "environ": _MADE})
    while True:
        readable, _, _ = select.select([sock, *children], [], [])
        for fd in readable:
            if fd is sock:
                request, fds = _recv(sock)
                if request is None:
                    os._exit(0)  # the owner is gone; children see their parent change and follow
                if "preload" in request:
                    _send(sock, {"preloaded": request["preload"],
                                 "environ": _preload(request["preload"], defaults=request["defaults"])})
                    continue
                try:
                    pid = os.fork()
                except OSError as exc:
                    for f in fds:
                        os.close(f)
                    _send(sock, {"error": str(exc)})
                    continue
                if pid == 0:
                    return request, fds, children
                for f in fds:
                    os.close(f)
                children[os.pidfd_open(pid)] = pid
                _send(sock, {"pid": pid})
            else:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


_MADE: dict[str, str] = {}  # what the zygote's first imports put in its environment (sent with "ready")


def _import(modules) -> dict[str, str]:
    """Import ``modules``; returns the variables the imports set or changed."""
    import gc
    import importlib

    before = dict(os.environ)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - e.g. absent, or broken: the child imports it itself and says why
            pass
    # Children would copy every page the collector walks: keep the preloaded objects out of its way
    gc.collect()
    gc.freeze()
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def _preload(modules: list[str], *, defaults: dict[str, str]) -> dict[str, str]:
    """Import a framework's modules with ``defaults`` in the environment (as its children set them);
    returns what the environment gained (the defaults included). A child's environment is its own."""
    saved = dict(os.environ)
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(added)
    try:
        return {**added, **_import(modules)}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _become(sock: socket.socket, request: dict, fds: list[int], children: dict[int, int]) -> None:
    """In the new child: its session, streams, directory and environment; nothing of the zygote's."""
    sock.close()
    for fd in children:
        os.close(fd)
    if request.get("session", True):
        os.setsid()
    for target, fd in zip(STREAMS, fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd not in STREAMS:
            os.close(fd)
    os.chdir(request["cwd"])
    if "setproctitle" in sys.modules:  # ps shows what a fresh process would (set before environ changes)
        sys.modules["setproctitle"].setproctitle(" ".join([sys.executable, "-m", request["module"],
                                                           *request["args"]]))
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy.random" in sys.modules:  # a fresh process's global numpy generator is seeded from the OS
        sys.modules["numpy.random"].seed()


def main(argv: list[str]) -> None:
    import runpy

    sock = socket.socket(fileno=int(argv[0]))
    _MADE.update(_import(PRELOAD))
    request = serve(sock)
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
