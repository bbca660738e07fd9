"""Shared fixtures: the digits demo data, written once per session; a digits job and a script job
that tests of several areas read.

Also ends the test process with ``os._exit`` once pytest is done (see
:func:`pytest_unconfigure`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_exit_status: int | None = None


@pytest.fixture(autouse=True)
def _fresh_progress(monkeypatch):
    """flextrain.elastic.progress keeps a process's step count (and State.restore sets it): each test
    starts as a new script process does."""
    from flextrain.elastic import progress

    monkeypatch.setattr(progress, "_last_step", 0)
    monkeypatch.setattr(progress, "_restored_step", 0)
    monkeypatch.setattr(progress, "_pending", [])


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory) -> Path:
    from flextrain.data.digits import write_digits

    out = tmp_path_factory.mktemp("digits")
    write_digits(out)
    return out


@pytest.fixture(scope="session")
def digits_fixed_g(digits_data, tmp_path_factory):
    """The digits model trained by two workers at a fixed G = 64 for 6 epochs: (job dir, process).

    The bar of tests/e2e/test_training_job.py, the fixed-G accuracy an adaptive G must reach, and the
    trained checkpoint tests/evaluation predicts with."""
    from ft_helpers import DIGITS_MODEL, run_flextrain

    job_dir: Path = tmp_path_factory.mktemp("digits-fixed-g") / "job"
    proc = run_flextrain(
        "train", "--model-def", DIGITS_MODEL, "--training-data", str(digits_data / "train"),
        "--validation-data", str(digits_data / "validation"), "--workers", "2", "--epochs", "6",
        "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1", "--job-dir", str(job_dir),
        env_extra={"FLEXTRAIN_READ_AHEAD": "0", "FLEXTRAIN_LOG_LEVEL": "INFO"},  # (the workers log their loads)
    )
    return job_dir, proc


@pytest.fixture(scope="session")
def script_scaled_and_killed(tmp_path_factory):
    """The script job of :func:`script_jobs_support.scale_up_and_kill`, run once: tests/scriptjobs checks
    the script's state through it, tests/observability the history it left."""
    from script_jobs_support import scale_up_and_kill

    return scale_up_and_kill(tmp_path_factory.mktemp("script-scaled-killed") / "job")


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL server for the session (tests/pg_server.py); skips, saying why, where none can start."""
    import pg_server

    why = pg_server.unavailable()
    if why:
        pytest.skip(why)
    # Not under pytest's temporary root: its directories are private to root, and the server runs as postgres.
    server = pg_server.PgServer(Path(tempfile.mkdtemp(prefix="flextrain-pg-"))).start()
    yield server
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)


# Session fixtures that run a whole job: under pytest-xdist (``make test`` runs two workers) the tests
# that use one go to the same worker, so the job runs once, not once per worker.
SHARED_JOBS = ("digits_fixed_g", "script_scaled_and_killed", "postgres")
# Areas whose tests mostly run jobs, processes or pods (besides those marked e2e or slow)
JOB_AREAS = ("tests/k8s/e2e/", "tests/k8s/backend/", "tests/tf/", "tests/examples/", "tests/accelerate/",
             "tests/scriptjobs/", "tests/observability/", "tests/badinput/", "tests/bench/")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Group tests for ``--dist loadgroup``: a test using a job of :data:`SHARED_JOBS` joins that job's
    group; one using a module- or class-scoped fixture joins its module's (those fixtures then run once).
    Every other test goes wherever a worker is free. Tests that run jobs come first (markers ``slow`` and
    ``e2e``, and the areas of :data:`JOB_AREAS`), the quick ones after: they fill the gaps at the end, so
    the two workers finish together instead of one waiting for the other's last long test.

    Tests marked ``cuda`` skip where torch sees no CUDA device (torch is imported only if there are any)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        shared = [name for name in SHARED_JOBS if name in defs]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif any(d[-1].scope in ("module", "class") for d in defs.values() if d):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("e2e")
                                     or item.nodeid.startswith(JOB_AREAS)))  # stable: file order within each
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    import torch

    if not torch.cuda.is_available():
        for item in marked:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


def pytest_sessionfinish(session, exitstatus) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """Leave without interpreter teardown once pytest has reported.

    This one process has loaded torch, TensorFlow, gRPC, kopf and kubernetes, and their
    C++ runtimes still own threads at exit. Their static destructors and Python's
    finalisation can race (CI once printed "842 passed" and then the process died of
    SIGABRT, failing ``make test``). Nothing of ours runs at that point: every test's
    fixtures are torn down and the summary is printed, and the product's own processes
    (master, workers, PS) exit through their own code, checked by the end-to-end tests.
    """
    if _exit_status is None or os.environ.get("FLEXTRAIN_TESTS_FULL_TEARDOWN") == "1":
        return  # e.g. a collection-only run, or debugging the teardown itself
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    os._exit(_exit_status)
