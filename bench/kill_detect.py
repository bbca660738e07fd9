"""How soon a peer learns that a process was SIGKILLed: kill -> EOF on a socket the victim held.

This is the floor under flextrain's recovery ``detect`` (bench/rescale.py): a survivor's gloo
collective fails when the kernel closes the killed worker's connections, and Linux closes a dying
process's files only after it has freed its address space (``do_exit``: ``exit_mm`` before
``exit_files``), so the time grows with the victim's memory. Victims (each a fresh process that
connects to this one, then sleeps):

* ``python``: a bare interpreter;
* ``torch``: after ``import torch`` (~150 MB of anonymous memory on torch 2.13 CPU);
* ``torch_plus_<N>mb``: ``import torch`` and N MB more, touched (a worker holds ~230 MB anonymous).

The sides take turns kill by kill (``--rounds`` each). stdout: one JSON object with per-side
medians and samples (ms) and each side's median over the bare interpreter's; progress on stderr.

Usage: .venv/bin/python bench/kill_detect.py [--rounds 9] [--extra-mb 100]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

VICTIM = r"""
import socket, sys, time
if sys.argv[2] != "python":
    import torch
extra = bytearray(int(sys.argv[3]) << 20)
for i in range(0, len(extra), 4096):  # touch every page: anonymous memory the kernel must free
    extra[i] = 1
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"r")
time.sleep(600)
"""


def one_kill(kind: str, extra_mb: int) -> float:
    """Seconds from SIGKILL to EOF on the victim's connection."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        proc = subprocess.Popen([sys.executable, "-c", VICTIM, str(srv.getsockname()[1]), kind, str(extra_mb)])
        try:
            conn, _ = srv.accept()
            with conn:
                conn.recv(1)  # the victim is ready
                t = time.perf_counter()
                os.kill(proc.pid, signal.SIGKILL)
                conn.recv(1)  # EOF: the kernel closed the victim's socket
                return time.perf_counter() - t
        finally:
            proc.kill()
            proc.wait()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9, help="kills per side (the sides take turns)")
    p.add_argument("--extra-mb", type=int, default=100, help="anonymous memory of the third victim, MB")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.extra_mb < 0:
        p.error(f"--rounds must be >= 1 and --extra-mb >= 0, got {args.rounds} and {args.extra_mb}")
    sides = {"python": ("python", 0), "torch": ("torch", 0), f"torch_plus_{args.extra_mb}mb": ("torch", args.extra_mb)}
    samples: dict[str, list[float]] = {name: [] for name in sides}
    load = round(os.getloadavg()[0], 2)
    for r in range(args.rounds):
        for name, (kind, mb) in sides.items():
            samples[name].append(one_kill(kind, mb) * 1000)
        print(f"[kill_detect] round {r + 1}/{args.rounds}: "
              + ", ".join(f"{n} {v[-1]:.1f} ms" for n, v in samples.items()), file=sys.stderr, flush=True)
    medians = {name: round(statistics.median(v), 2) for name, v in samples.items()}
    print(json.dumps({
        "bench": "kill_detect",
        "kill_to_eof_ms": {name: {"median": medians[name], "samples": [round(x, 2) for x in v]}
                           for name, v in samples.items()},
        "ratio_over_python": {name: round(m / medians["python"], 2) for name, m in medians.items()},
        "environment": {"cpus": os.cpu_count(), "load_avg_1m_at_start": load},
        "method": "SIGKILL of a process connected to this one over loopback TCP -> recv() returning EOF here; "
                  "victims take turns kill by kill; medians in ms.",
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
