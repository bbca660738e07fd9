"""A local job's children exit when their master dies without cleaning up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

from ft_helpers import wait_for


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its reaper counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_parameter_server_exits_when_its_master_is_killed(tmp_path):
    addr = tmp_path / "ps.addr"
    # A stand-in master: it launches a PS the way the local backend does, then is SIGKILLed.
    master = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        from flextrain.orphans import ENV_PARENT_PID
        env = {{**os.environ, ENV_PARENT_PID: str(os.getpid())}}
        child = subprocess.Popen([sys.executable, "-m", "flextrain", "ps", "--shard-index", "0", "--num-ps", "1",
                                  "--port", "0", "--address-file", {str(addr)!r}, "--no-wal"],
                                 env=env, start_new_session=True)
        print(child.pid, flush=True)
        child.wait()
    """)], stdout=subprocess.PIPE, text=True)
    ps_pid = int(master.stdout.readline())
    wait_for(addr.exists, timeout=60, what="the PS to serve")
    assert _alive(ps_pid)
    master.send_signal(signal.SIGKILL)
    master.wait()
    wait_for(lambda: not _alive(ps_pid), timeout=30, what="the orphaned PS to exit")


def test_without_a_local_master_nothing_is_watched(monkeypatch):
    from flextrain import orphans

    monkeypatch.delenv(orphans.ENV_PARENT_PID, raising=False)
    orphans.exit_with_parent()
    assert "exit-with-parent" not in {t.name for t in threading.enumerate()}
