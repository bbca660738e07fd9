"""The operator's own Prometheus metrics (``flextrain operator --metrics-port``; docs/observability.md).

* ``flextrain_operator_jobs{phase}``: ElasticJobs the operator watches, by phase, as its last sweep listed
  them (every ``--sweep-interval`` seconds; a job without a phase yet counts as ``New``).
* ``flextrain_operator_reconcile_errors_total``: handler calls and per-job sweep checks that raised
  (kopf retries a handler; the sweep tries again next time).
* ``flextrain_operator_master_relaunches_total``: master pods the operator relaunched.

A job's own figures are its master's (flextrain/master/metrics.py), not the operator's.
"""

from __future__ import annotations

import functools
from collections import Counter as Tally
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import start_http_server

PHASES = ("New", "Pending", "Running", "Succeeded", "Failed")


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.jobs = Gauge("flextrain_operator_jobs", "ElasticJobs watched, by phase (as of the last sweep)",
                          ["phase"], registry=self.registry)
        for phase in PHASES:
            self.jobs.labels(phase).set(0)
        self.reconcile_errors = Counter("flextrain_operator_reconcile_errors", "Handler calls and sweep checks "
                                        "that raised", registry=self.registry)
        self.master_relaunches = Counter("flextrain_operator_master_relaunches", "Master pods relaunched",
                                         registry=self.registry)
        self._server = None
        self.port = 0

    def serve(self, *, port: int, host: str = "0.0.0.0") -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def swept(self, jobs: Iterable[dict]) -> None:
        """The jobs one sweep listed: the per-phase gauge follows them (phases no job has read 0)."""
        tally = Tally(((job.get("status") or {}).get("phase") or "New") for job in jobs)
        for phase in {*PHASES, *tally}:
            self.jobs.labels(phase).set(tally.get(phase, 0))

    def counted(self, handler: Callable) -> Callable:
        """``handler`` with each exception it raises counted as a reconcile error (and raised on)."""
        @functools.wraps(handler)
        def wrapper(*args, **kwargs):
            try:
                return handler(*args, **kwargs)
            except Exception:
                self.reconcile_errors.inc()
                raise
        return wrapper


__all__ = ["OperatorMetrics", "PHASES"]
