"""The process a script job's agent starts: ``python -m flextrain.worker.script_child SCRIPT ARGS...``.

It runs the user's script as ``python SCRIPT ARGS`` would (``__name__ ==
"__main__"``, ``sys.argv``, the script's directory first on ``sys.path``),
with two additions an agent needs:

* it dies with its agent (``PR_SET_PDEATHSIG`` on Linux, else a poll of the
  parent pid): a killed agent must not leave a script in the old world;
* an exception (or ``sys.exit`` with a non-zero code) is written, as a
  ``Failure`` message, to ``$FLEXTRAIN_FAILURE_FILE`` before the process
  exits with its failure code, so the agent can report the script's own
  error — type, message, the script's file:line, traceback — as the job's
  failure reason (torchelastic's error file, in flextrain's words).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

ENV_FAILURE_FILE = "FLEXTRAIN_FAILURE_FILE"
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the poll below still ends an orphan within a second
        pass
    from flextrain.orphans import ENV_PARENT_PID, exit_with_parent

    os.environ[ENV_PARENT_PID] = str(parent)
    exit_with_parent()  # also covers an agent gone before prctl took effect


def _report(exc: BaseException) -> int:
    """Write the failure file; returns the exit code of the failure's kind."""
    from flextrain.worker.failure import failure_of, log_failure, one_line

    failure = failure_of(exc, stage="running the script", step=0, script=True)
    log_failure(f"the script failed: {one_line(failure)}", exc)
    path = os.environ.get(ENV_FAILURE_FILE)
    if path:
        try:
            Path(path).write_bytes(failure.SerializeToString())
        except OSError as write_exc:  # the exit code and the log still tell the agent
            print(f"flextrain: cannot write {path}: {write_exc}", file=sys.stderr)
    return failure.exit_code


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m flextrain.worker.script_child SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    _die_with_parent()
    script = os.path.abspath(argv[0])
    sys.argv = [argv[0], *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code in (0, None):
            return 0
        return _report(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's error, reported to the agent
        return _report(exc)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # The script is done (its commits are fsynced). Leave without interpreter teardown: with gloo,
    # torch's threads sometimes abort it ('terminate called without an active exception', SIGABRT)
    # even for plain DDP scripts, which would turn a finished script into a failed worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
