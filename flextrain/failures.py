"""What a failed process says about its failure: exit codes and failure kinds.

Worker and master agree on these without importing each other: a worker that
fails reports a :class:`FailureKind` with its exception (the ``Failure``
message of the wire protocol) and exits with the matching :class:`ExitCode`;
the master classifies every exit by code, report and signal. The codes are
documented for users (docs/troubleshooting.md) because they are what
``kubectl get pods`` and a shell show.

Two families of failure are told apart:

* the job's own: the user's code raised or exited, the module broke its
  contract, the loss went non-finite. Launching again gives the same error,
  so the job fails fast with that error as its reason.
* infrastructure: a process killed by a signal (SIGKILL, OOM, preemption, a
  lost node) or a lost master connection. The worker is relaunched.
"""

from __future__ import annotations

import enum
import signal


class ExitCode(enum.IntEnum):
    """Exit status of ``flextrain worker``, and of ``flextrain train`` for a job that failed
    for one of these reasons (any other failed job: INTERNAL's 1, e.g. too few workers)."""

    OK = 0                # the master said the job is over or told the worker to leave
    INTERNAL = 1          # an error in flextrain itself (please report it)
    USAGE = 2             # bad command line or job description (`flextrain: error: ...`)
    USER_CODE = 3         # the user's module raised (or called sys.exit) in the worker
    MODULE_CONTRACT = 4   # the module broke its contract (wrong kind returned, no parameters, ...)
    NON_FINITE = 5        # a non-finite loss or gradient with --nan-policy fail
    DATA = 6              # records that cannot be read or parsed (file and offset named)
    MASTER_LOST = 7       # the master did not answer for the client's give-up time
    RELEASED = 8          # left a collective the master declared dead (not a failure)


class FailureKind(str, enum.Enum):
    USER_CODE = "UserCode"
    MODULE_CONTRACT = "ModuleContract"
    NON_FINITE = "NonFinite"
    DATA = "Data"                        # records that cannot be read or parsed
    UNEXPECTED_EXIT = "UnexpectedExit"   # the process exited by itself without saying why
    HANG = "Hang"                        # killed by the master: no progress for --worker-timeout
    INFRASTRUCTURE = "Infrastructure"    # killed by a signal, the node, or the master
    MASTER_LOST = "MasterUnreachable"
    INTERNAL = "Internal"

    @property
    def user_caused(self) -> bool:
        """A relaunch would meet the same error: the job itself is at fault, not the cluster."""
        return self in (FailureKind.USER_CODE, FailureKind.MODULE_CONTRACT, FailureKind.NON_FINITE,
                        FailureKind.DATA, FailureKind.UNEXPECTED_EXIT, FailureKind.HANG, FailureKind.INTERNAL)


_KIND_OF_CODE = {
    ExitCode.INTERNAL: FailureKind.INTERNAL,
    ExitCode.USER_CODE: FailureKind.USER_CODE,
    ExitCode.MODULE_CONTRACT: FailureKind.MODULE_CONTRACT,
    ExitCode.NON_FINITE: FailureKind.NON_FINITE,
    ExitCode.DATA: FailureKind.DATA,
    ExitCode.MASTER_LOST: FailureKind.MASTER_LOST,
}

EXIT_CODE_OF_KIND = {kind: code for code, kind in _KIND_OF_CODE.items()}


def kind_of_exit(code: int) -> FailureKind:
    """The failure kind an exit code implies when the process reported nothing."""
    if code >= 128:
        return FailureKind.INFRASTRUCTURE
    try:
        return _KIND_OF_CODE.get(ExitCode(code), FailureKind.UNEXPECTED_EXIT)
    except ValueError:  # a code of the user's own (os._exit(42))
        return FailureKind.UNEXPECTED_EXIT


def signal_name(code: int) -> str | None:
    """``"SIGKILL"`` for exit code 137 (128 + signal, the shell and Kubernetes convention)."""
    if code < 128:
        return None
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def describe_exit(code: int) -> str:
    """``code 137 (SIGKILL)``, ``code 3 (user code)``: what follows "exited with"."""
    if (name := signal_name(code)) is not None:
        return f"code {code} ({name})"
    try:
        meaning = ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        return f"code {code}"
    return f"code {code} ({meaning})"


__all__ = ["ExitCode", "FailureKind", "EXIT_CODE_OF_KIND", "kind_of_exit", "signal_name", "describe_exit"]
