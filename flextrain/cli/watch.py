"""``flextrain status JOB --watch``: the status summary, refreshed in place every second until the job ends.

Shared by local jobs (status.json) and Kubernetes ones (the ElasticJob's status): the caller gives
how to read the job's summary lines and whether it is over; this module only refreshes (rich Live).
"""

from __future__ import annotations

import time
from typing import Callable

INTERVAL = 1.0  # seconds between refreshes
OVER = ("Succeeded", "Failed")


def watch(read: Callable[[], tuple[list[str], bool]], *, interval: float = INTERVAL) -> int:
    """Show ``read()``'s lines, refreshed every ``interval`` seconds, until ``read`` says the job is
    over (its final lines stay on the screen) or Ctrl-C; returns the exit code (0)."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    lines, over = read()
    console = Console()
    if not console.is_terminal:  # piped or redirected: nothing to refresh in place, so each change as a block
        return _log(read, lines, over, interval=interval)
    with Live(Text("\n".join(lines)), console=console, auto_refresh=False, transient=False) as live:
        try:
            while not over:
                time.sleep(interval)  # the refresh period the user sees, not a synchronisation
                lines, over = read()
                live.update(Text("\n".join(lines)), refresh=True)
        except KeyboardInterrupt:
            pass
    return 0


def _log(read: Callable[[], tuple[list[str], bool]], lines: list[str], over: bool, *, interval: float) -> int:
    """The summary each time it changes, blocks apart by a blank line, until the job is over."""
    print("\n".join(lines), flush=True)
    try:
        while not over:
            time.sleep(interval)  # the refresh period, not a synchronisation
            shown, (lines, over) = lines, read()
            if lines != shown:
                print("\n" + "\n".join(lines), flush=True)
    except KeyboardInterrupt:
        pass
    return 0


__all__ = ["INTERVAL", "OVER", "watch"]
