"""A local job's workers and parameter servers exit when their master is gone.

The local launch backend starts them in their own sessions (so a Ctrl-C reaches
only the master), which also means nothing kills them if the master dies
without cleaning up (SIGKILL, an OOM kill, a crashed test run). An orphan
would hold ports and CPU forever, so each child polls its parent pid and exits
when it changes. On Kubernetes the master deletes its pods instead, and the
variable is not set.

A worker's alive mark (flextrain/worker/peerwatch.py: a small file in /dev/shm named for its pid) is
removed by the process itself, or by a peer that saw it die; a killed worker no peer watched (a
lone worker) leaves it behind, so the local launcher removes the marks of every child it reaps.
"""

from __future__ import annotations

import logging
import os
import threading

ENV_PARENT_PID = "FLEXTRAIN_PARENT_PID"
ALIVE_MARK_PREFIX = "flextrain-alive-"  # + "<pid>-<token>": one name for writer (peerwatch) and reaper
POLL_SECONDS = 1.0


def exit_with_parent() -> None:
    """If started by a local master (``FLEXTRAIN_PARENT_PID``), exit once it is gone."""
    raw = os.environ.get(ENV_PARENT_PID)
    if not raw:
        return
    parent = int(raw)
    if os.getppid() != parent:
        os._exit(1)  # the master died before we even started
    gone = threading.Event()

    def watch() -> None:
        # A poll, not a wait on anything: Linux offers no portable "parent exited" event
        # for a process in its own session (PR_SET_PDEATHSIG follows the forking thread).
        while not gone.wait(POLL_SECONDS):
            if os.getppid() != parent:
                logging.getLogger("flextrain").error("master (pid %d) is gone; exiting", parent)
                os._exit(1)  # nothing here is worth keeping without a master; PS state is on disk

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def remove_alive_marks(pid: int, *, directory: str = "/dev/shm") -> None:
    """Remove what a reaped process ``pid`` may have left of its alive marks."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(f"{ALIVE_MARK_PREFIX}{pid}-"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass  # its peer removed it first
