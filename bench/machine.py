"""What the benches need from the machine: other processes' CPU use, and pausing a process tree.

Shared by ``bench/overhead.py`` and ``bench/interleave.py``. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import signal
import sys
import time


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


class CPUMeter:
    """Average CPU cores the rest of the machine (other processes, hypervisor steal) used
    meanwhile: busy time from /proc/stat minus this process's and its waited-for children's."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.other_cores: float | None = None

    def _sample(self):
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        fields = fields[:8]  # user nice system idle iowait irq softirq steal (guest is inside user)
        idle = fields[3] + fields[4]
        t = os.times()
        return (sum(fields) - idle) / self.tick, t.user + t.system + t.children_user + t.children_system

    def __enter__(self):
        self.start = self._sample()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        end = self._sample()
        wall = time.perf_counter() - self.t0
        if self.start is not None and end is not None and wall > 0:
            other = (end[0] - self.start[0]) - (end[1] - self.start[1])
            self.other_cores = max(0.0, other / wall)


def wait_until_quiet(max_other: float, timeout: float, interval: float = 0.5) -> float:
    """Wait (at most ``timeout`` s) until other processes use <= ``max_other`` cores; returns seconds waited."""
    t0 = time.perf_counter()
    announced = False
    while True:
        with CPUMeter() as m:
            time.sleep(interval)
        waited = time.perf_counter() - t0
        if m.other_cores is None or m.other_cores <= max_other or waited >= timeout:
            return waited - interval
        if not announced:
            log(f"  other processes use {m.other_cores:.2f} cores; waiting up to {timeout:.0f}s for a quiet CPU")
            announced = True


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, from the parent pids in ``/proc/*/stat``.

    Process groups do not do: flextrain's launcher starts each worker in a session of its own.
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


class ProcessTree:
    """Stop (SIGSTOP) and continue (SIGCONT) a process and all its descendants together.

    The known pids are signalled first, so the tree stops within microseconds of itself; the
    tree is then listed again and any newcomer is stopped too, until the listing is stable.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.pids: list[int] = [root]

    def _signal(self, pids, sig) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        self._signal(self.pids, signal.SIGSTOP)
        while True:
            current = descendants(self.root)
            new = [pid for pid in current if pid not in self.pids]
            self.pids = current
            if not new:
                return
            self._signal(new, signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(self.pids, signal.SIGCONT)

    def cpu_seconds(self) -> dict[int, float]:
        """User + system CPU seconds of each of the tree's processes as last listed (``/proc/PID/stat``)."""
        tick, found = os.sysconf("SC_CLK_TCK"), {}
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited
            found[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (stat fields 14 and 15)
        return found
