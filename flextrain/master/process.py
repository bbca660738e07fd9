"""The master process's dealings with its host, apart from its main loop (``main.py``): signals,
the address workers dial, local workers' environment and memory limit, the exit code, the summary
printed at the end."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from flextrain.failures import EXIT_CODE_OF_KIND, ExitCode
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.failures import failure_lines
from flextrain.master.status import metric_text


def read_ahead_env(*, cores: int, threads: int, workers: int, gpu: bool) -> dict[str, str]:
    """Environment for local workers about their read-ahead thread.

    They share this machine's cores, which their torch threads claim: a read-ahead thread would
    only preempt those (flextrain/worker/prefetch.py) unless a GPU computes or a core is left
    over for each worker. A user's own ``FLEXTRAIN_READ_AHEAD`` is left alone.
    """
    if gpu or "FLEXTRAIN_READ_AHEAD" in os.environ or cores - threads * workers >= workers:
        return {}
    return {"FLEXTRAIN_READ_AHEAD": "0"}


def exit_code(job: JobMaster) -> int:
    """0 when the job succeeded; else the code of its failure's kind (docs/troubleshooting.md)."""
    if job.phase is Phase.SUCCEEDED:
        return ExitCode.OK
    return int(EXIT_CODE_OF_KIND.get(job.failure.kind, ExitCode.INTERNAL)) if job.failure else ExitCode.INTERNAL


def _bytes(size) -> int | None:
    """A memory size of the spec in bytes (the CLI checked it: flextrain.cli.train.check_memory_flag)."""
    from flextrain.elastic.sizes import parse_memory

    return parse_memory(size, what="--worker-memory-limit")


def _status_json(reporter) -> str:
    import json

    return json.dumps(reporter.snapshot())


def _print_summary(console: Console, snap: dict) -> None:
    style = "green" if snap["phase"] == Phase.SUCCEEDED.value else "red"
    console.print(f"[{style}]job {snap['name']} {snap['phase']}[/]: {escape(snap['message'])}", highlight=False,
                  soft_wrap=True)
    for line in failure_lines(snap.get("failure")):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for name, value in sorted(snap["metrics"].items()):
        console.print(f"  {name}: {metric_text(value)}")
    console.print(f"  status: {Path(snap['jobDir']) / 'status.json'}")


def _install_signal_handlers(callback):
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = lambda signum, frame: callback()  # noqa: E731
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(previous) -> None:
    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)
