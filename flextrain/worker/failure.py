"""What a worker tells the master about an error: its kind, the user's frame, the traceback.

The master names the job's failure from this report, so it must point at the
user's own code when that is where the error arose: the *user frame* is the
innermost frame of the traceback (or of the exceptions that caused it) that
lies outside flextrain, the Python standard library and installed packages.
An error in flextrain itself has no user frame and is reported as INTERNAL.
"""

from __future__ import annotations

import logging
import sysconfig
import traceback
from pathlib import Path

from flextrain.data import DataError
from flextrain.failures import EXIT_CODE_OF_KIND, ExitCode, FailureKind
from flextrain.proto import flextrain_pb2 as pb
from flextrain.protocol.limits import MAX_TEXT_CHARS
from flextrain.worker.module import ModelDefError

log = logging.getLogger("flextrain.worker")

TRACEBACK_TAIL = 4000  # characters of the formatted traceback sent to the master

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
_SYSTEM_DIRS = tuple({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")})


class NonFiniteError(ArithmeticError):
    """A loss or gradient that is NaN or infinite (``--nan-policy fail``); the message names the step."""


def describe(exc: BaseException) -> str:
    """An error message for the master or a log line: the exception's own text, its type if it has none."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else repr(exc)


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    path = Path(filename).resolve()
    return not any(path.is_relative_to(d) for d in (_PACKAGE_DIR, *_SYSTEM_DIRS))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return out


def user_frame(exc: BaseException) -> tuple[BaseException, traceback.FrameSummary] | None:
    """The innermost frame in the user's code, and the exception whose traceback holds it."""
    for link in _chain(exc):
        frames = [f for f in traceback.extract_tb(link.__traceback__) if _is_user_file(f.filename)]
        if frames:
            return link, frames[-1]
    return None


def _user_syntax_error(exc: BaseException) -> SyntaxError | None:
    """A SyntaxError in one of the user's files (it has no frame of theirs: it says where it is)."""
    if isinstance(exc, SyntaxError) and exc.filename and _is_user_file(exc.filename):
        return exc
    return None


def classify(exc: BaseException) -> FailureKind:
    if isinstance(exc, NonFiniteError):
        return FailureKind.NON_FINITE
    if isinstance(exc, DataError):
        return FailureKind.DATA
    if user_frame(exc) is not None or _user_syntax_error(exc) is not None:
        return FailureKind.USER_CODE
    if isinstance(exc, ModelDefError):
        return FailureKind.MODULE_CONTRACT
    return FailureKind.INTERNAL


def exit_code(kind: FailureKind) -> ExitCode:
    return EXIT_CODE_OF_KIND.get(kind, ExitCode.INTERNAL)


def _message(exc: BaseException, *, script: bool = False) -> str:
    if isinstance(exc, SystemExit):
        if script:  # a script's normal way out: what it exited with
            return f"the script exited with code {exc.code}" if isinstance(exc.code, int) else \
                f"the script exited: {exc.code}"
        return f"sys.exit({exc.code!r}) was called inside the worker"
    return str(exc) or repr(exc)


def failure_of(exc: BaseException, *, stage: str, step: int, script: bool = False) -> pb.Failure:
    """The report for ``exc``: for the user's own errors, their exception and their file:line (``script``: raised
    by a script job's script)."""
    kind = classify(exc)
    found = user_frame(exc)
    shown = exc
    if found is not None and kind is FailureKind.USER_CODE:
        shown = found[0]  # e.g. the model's RuntimeError, not the loader's wrapper around it
    location = f"{found[1].filename}:{found[1].lineno} in {found[1].name}" if found else ""
    if not found and (syntax := _user_syntax_error(exc)) is not None:
        location = f"{syntax.filename}:{syntax.lineno}"
    # The user's own exception's traceback (the wrappers around it are in the worker's log).
    text = "".join(traceback.format_exception(shown))
    return pb.Failure(
        kind=kind.value, exit_code=int(exit_code(kind)), exception=type(shown).__name__,
        message=_message(shown, script=script)[:MAX_TEXT_CHARS], location=location[-MAX_TEXT_CHARS:], traceback=text[-TRACEBACK_TAIL:], stage=stage, step=step,
    )


def one_line(failure: pb.Failure) -> str:
    """``RuntimeError: no vocab (at model.py:12 in __init__)`` for task reports and logs."""
    at = f" (at {failure.location})" if failure.location else ""
    return f"{failure.exception}: {failure.message}{at}"


def log_failure(what: str, exc: BaseException) -> None:
    """Write the full traceback to the worker's log (the master keeps only its tail)."""
    log.error("%s\n%s", what, "".join(traceback.format_exception(exc)).rstrip())


__all__ = ["NonFiniteError", "classify", "exit_code", "failure_of", "log_failure",
           "one_line", "user_frame"]
