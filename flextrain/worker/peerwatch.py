"""Learning that a peer's process is gone before its sockets say so: robust futexes.

A SIGKILLed worker's gloo connections close only when the kernel has freed its memory
(``exit_mm`` runs before ``exit_files``): 10-20 ms for a worker's ~230 MB on a quiet machine,
100 ms and more under load (``bench/kill_detect.py``), and the master's ``waitpid`` sees the exit
no sooner. The kernel releases a dying thread's *robust futexes* at the very start of ``exit_mm``,
before any memory is freed, so a peer blocked on one learns of the death within a millisecond.

* :class:`AliveMark`: every worker process creates a robust, process-shared pthread mutex in a
  small file in shared memory (``/dev/shm``) and locks it on its main thread for life.
* :class:`PeerWatch`: for each round, the members publish their mark's descriptor under the
  round's store prefix (on a thread of their own, off the training path); each member then keeps
  one thread per peer process blocked locking that peer's mutex. The lock returns (``EOWNERDEAD``
  to the first waiter, which unlocks it inconsistent: ``ENOTRECOVERABLE`` to every other) only when
  the peer's main thread exits: its process is going, for certain.
  ``on_exit(worker_id, rounds)`` is called with the rounds the peer was a member of; the
  collective breaks its group's connections at once if it is in one of them, and the worker tells
  the master which peer exited when it joins the next rendezvous (so the master need not wait for
  its launcher's ``waitpid``).

Only peers on the same host and in the same shared-memory namespace can be watched (the
descriptor carries host name, boot id and a random token the file must hold); the others are
detected by their sockets closing, as before. A watch never times anything out: a slow peer is
never taken for a dead one. The mark's file is removed by its process at a normal exit and by
the peer that saw it die otherwise (or its launcher), so a watch that comes late and finds a
peer's file gone from its own mount (the descriptor names the mount's device) takes that peer for
exited: a quicker watcher saw the death first.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import json
import logging
import mmap
import os
import secrets
import socket
import tempfile
import threading
from datetime import timedelta
from typing import Callable

from flextrain.orphans import ALIVE_MARK_PREFIX

log = logging.getLogger("flextrain.worker")

_MUTEX_BYTES = 64  # pthread_mutex_t is 40 bytes on glibc x86-64 / aarch64; the token follows it
_TOKEN_BYTES = 32
_FILE_BYTES = _MUTEX_BYTES + _TOKEN_BYTES
_PSHARED, _ROBUST = 1, 1  # PTHREAD_PROCESS_SHARED, PTHREAD_MUTEX_ROBUST
PUBLISH_TIMEOUT = timedelta(seconds=15)  # a member that never publishes died before it could


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_mutexattr_setrobust  # noqa: B018 - raises AttributeError where robust mutexes are missing
    return libc


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _map(path: str, *, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, _FILE_BYTES)
        return mmap.mmap(fd, _FILE_BYTES)
    finally:
        os.close(fd)


class AliveMark:
    """This process's robust mutex, locked for life by the thread that creates it (which must live
    as long as the process: the main thread; its exit is what peers see)."""

    def __init__(self, *, directory: str | None = None) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("AliveMark must be created on the main thread (peers take its exit for the process's)")
        self._libc = _libc()
        directory = directory or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        self.token = secrets.token_hex(_TOKEN_BYTES // 2)
        self.path = os.path.join(directory, f"{ALIVE_MARK_PREFIX}{os.getpid()}-{self.token[:8]}")
        self.device = os.stat(directory).st_dev  # which shared-memory mount: peers on it see our file
        self._map = _map(self.path, create=True)
        self._mutex = (ctypes.c_char * _MUTEX_BYTES).from_buffer(self._map)
        attr = ctypes.create_string_buffer(16)
        for call in (lambda: self._libc.pthread_mutexattr_init(attr),
                     lambda: self._libc.pthread_mutexattr_setpshared(attr, _PSHARED),
                     lambda: self._libc.pthread_mutexattr_setrobust(attr, _ROBUST),
                     lambda: self._libc.pthread_mutex_init(self._mutex, attr),
                     lambda: self._libc.pthread_mutex_lock(self._mutex)):
            if (code := call()) != 0:
                os.unlink(self.path)
                raise OSError(code, f"alive mark {self.path}: {os.strerror(code)}")
        self._map[_MUTEX_BYTES:_FILE_BYTES] = self.token.encode()
        atexit.register(self.remove)

    def descriptor(self, worker_id: str) -> bytes:
        """What a peer needs to watch this process (published under the round's store prefix)."""
        return json.dumps({"worker": worker_id, "host": socket.gethostname(), "boot": _boot_id(),
                           "path": self.path, "token": self.token,
                           "device": self.device}).encode()

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


OnExit = Callable[[str, frozenset], None]


class PeerWatch:
    """Watches the peers of this worker's rounds (see the module docstring)."""

    def __init__(self, mark: AliveMark, *, worker_id: str, on_exit: OnExit) -> None:
        self.mark, self.worker_id, self.on_exit = mark, worker_id, on_exit
        self._lock = threading.Lock()
        self._rounds: dict[str, set[int]] = {}  # peer token -> rounds it was a member of (with us)
        self._store = None  # the watch's own store client (a TCPStore client is not shared across threads)
        self._address: tuple[str, int] | None = None
        self.seen_exits = 0  # peers whose exit this watch saw (tests count them)

    def round(self, *, host: str, port: int, round_id: int, rank: int, world_size: int) -> None:
        """The worker joins round ``round_id``: publish our mark and watch the others', in the
        background (the training thread does not wait for any of it)."""
        threading.Thread(target=self._round, args=(host, port, round_id, rank, world_size), daemon=True,
                         name=f"flextrain-peerwatch-round-{round_id}").start()

    def _round(self, host: str, port: int, round_id: int, rank: int, world_size: int) -> None:
        import torch.distributed as dist

        try:
            if self._store is None or self._address != (host, port):
                self._store = dist.TCPStore(host, port, is_master=False, timeout=PUBLISH_TIMEOUT)
                self._address = (host, port)
            prefix = dist.PrefixStore(f"round-{round_id}/alive/", self._store)
            prefix.set(str(rank), self.mark.descriptor(self.worker_id))
            for peer in range(world_size):
                if peer != rank:
                    self._watch(json.loads(prefix.get(str(peer))), round_id)
        except Exception as exc:  # noqa: BLE001 - a peer gone before publishing: its sockets tell, as before
            log.debug("peer watch of round %d incomplete: %s", round_id, exc)

    def _watch(self, peer: dict, round_id: int) -> None:
        if peer["host"] != socket.gethostname() or peer["boot"] != _boot_id() or peer["token"] == self.mark.token:
            return  # another machine or namespace: its futex is not ours to wait on
        token = peer["token"]
        with self._lock:
            if token in self._rounds:
                self._rounds[token].add(round_id)
                return
            try:
                view = _map(peer["path"], create=False)
            except FileNotFoundError:
                if peer.get("device") != self.mark.device:
                    return  # another /dev/shm (same host name and boot, another mount): not ours to watch
                view = None  # on our mount, its file is removed only once its process exits (module docstring)
            except OSError:
                return
            if view is None:
                self.seen_exits += 1
            elif view[_MUTEX_BYTES:_FILE_BYTES] != token.encode():
                view.close()
                return
            else:
                self._rounds[token] = {round_id}
        if view is None:
            # It died before this (late) watch opened its file, and a quicker watcher already removed it:
            # its sockets may stay open a while, so only this tells our collective.
            self.on_exit(peer["worker"], frozenset({round_id}))
            return
        threading.Thread(target=self._wait, args=(peer, view), daemon=True,
                         name=f"flextrain-peerwatch-{peer['worker']}").start()

    def _wait(self, peer: dict, view: mmap.mmap) -> None:
        mutex = (ctypes.c_char * _MUTEX_BYTES).from_buffer(view)
        code = self.mark._libc.pthread_mutex_lock(mutex)  # blocks (GIL released) until the peer's main thread exits
        if code not in (0, errno.EOWNERDEAD, errno.ENOTRECOVERABLE):
            log.debug("peer watch of %s: pthread_mutex_lock: %s", peer["worker"], os.strerror(code))
            return
        if code != errno.ENOTRECOVERABLE:
            # The kernel wakes one waiter of a dead owner's mutex: unlocked without being made
            # consistent, it turns not recoverable and wakes the next (every other member's watch).
            self.mark._libc.pthread_mutex_unlock(mutex)
        with self._lock:
            rounds = frozenset(self._rounds.pop(peer["token"], ()))
            self.seen_exits += 1
        try:
            self.on_exit(peer["worker"], rounds)
        finally:
            del mutex
            view.close()
            try:
                os.unlink(peer["path"])  # its process cannot any more
            except OSError:
                pass


def alive_mark() -> AliveMark | None:
    """This process's mark, or None where robust process-shared mutexes are not available (the
    watch is then off: deaths are seen when sockets close). Linux only: the collective finds its
    group's sockets in ``/proc/self/fd``."""
    if not os.path.isdir("/proc/self/fd"):
        log.info("peer exit watch off: no /proc/self/fd")
        return None
    try:
        return AliveMark()
    except (OSError, AttributeError, RuntimeError) as exc:
        log.info("peer exit watch off: %s", exc)
        return None
