"""The master's Prometheus endpoint (``--metrics-port``; docs/observability.md).

Contract: :class:`JobMetrics` is one of the status reporter's sinks — every second it is handed the job's
status snapshot (the same dict status.json and the ElasticJob status are written from), and a scrape
reads the newest one: gauges and counters are the snapshot's figures at that moment, so what Prometheus
shows never disagrees with ``flextrain status``. The two latencies users ask about — how long a
recovery and a join took — are histograms fed once per round formed, from the round's entry in the
snapshot's ``roundHistory`` (``recoverySeconds``: from the master learning that a member was lost to the
next round; ``joinSeconds``: per newcomer, from its launch — or a spare taken — to its first round).

Counters that a master restart resets (samples, rounds, relaunches) are exported as counters; Prometheus's
``rate()`` copes with resets. The HTTP server is prometheus_client's own (a daemon thread).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from flextrain.master.phase import Phase

SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class JobMetrics:
    """A status sink that serves the job's metrics (module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._snapshot: dict = {}
        self._last_round = -1  # the newest round whose timings went into the histograms
        self.recovery = Histogram("flextrain_recovery_seconds", "From the master learning that a member of the "
                                  "running round was lost to the next round formed", buckets=SECONDS_BUCKETS,
                                  registry=self.registry)
        self.join = Histogram("flextrain_join_seconds", "From a worker's launch (or a spare taken) to the first "
                              "round it trains in, for workers joining a running job", buckets=SECONDS_BUCKETS,
                              registry=self.registry)
        self.registry.register(_SnapshotCollector(self))
        self._server = None
        self.url = ""

    def serve(self, *, host: str, port: int, shown_host: str | None = None) -> str:
        """Listen on ``host:port`` (0: a free port); returns the URL to scrape (``shown_host`` in it)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        self.url = f"http://{shown_host or host}:{self._server.server_port}/metrics"
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __call__(self, snapshot: dict) -> None:
        with self._lock:
            self._snapshot = snapshot
            for entry in snapshot.get("roundHistory") or ():
                if entry["round"] <= self._last_round:
                    continue
                self._last_round = entry["round"]
                if (seconds := entry.get("recoverySeconds")) is not None:
                    self.recovery.observe(seconds)
                for seconds in (entry.get("joinSeconds") or {}).values():
                    self.join.observe(seconds)

    def latest(self) -> dict:
        with self._lock:
            return self._snapshot


def _number(value) -> float | None:
    """A snapshot figure as a sample value; None for what is not a number (a metric shown as "nan" is NaN)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


class _SnapshotCollector(Collector):
    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator:
        s = self.metrics.latest()
        if not s:
            return
        info = GaugeMetricFamily("flextrain_job_info", "The job this master runs (always 1)", labels=["job", "phase"])
        info.add_metric([s["name"], s["phase"]], 1)
        yield info
        phase = GaugeMetricFamily("flextrain_job_phase", "1 for the phase the job is in", labels=["phase"])
        for p in Phase:
            phase.add_metric([p.value], 1 if s["phase"] == p.value else 0)
        yield phase
        yield GaugeMetricFamily("flextrain_step", "Optimizer steps done (the model version)", value=s["step"])
        yield CounterMetricFamily("flextrain_samples", "Training records applied",
                                  value=s["progress"]["recordsDone"])
        yield GaugeMetricFamily("flextrain_samples_per_second", "Records applied per second, recent average",
                                value=s["samplesPerSecond"])
        yield GaugeMetricFamily("flextrain_epoch", "The epoch in progress", value=s["epoch"])
        if (loss := _number((s.get("metrics") or {}).get("loss"))) is not None:
            yield GaugeMetricFamily("flextrain_loss", "Mean of the workers' latest training losses", value=loss)
        if "globalBatchSize" in s:
            yield GaugeMetricFamily("flextrain_global_batch", "Global batch of the step in progress",
                                    value=s["globalBatchSize"])
            yield GaugeMetricFamily("flextrain_lr_factor", "The LR rule's factor on the step in progress",
                                    value=s["lrFactor"])
        if "learningRate" in s:
            yield GaugeMetricFamily("flextrain_learning_rate", "Learning rate of the step in progress",
                                    value=s["learningRate"])
        workers = GaugeMetricFamily("flextrain_workers", "Workers wanted, training in the round, and spares parked",
                                    labels=["state"])
        workers.add_metric(["desired"], s["workers"]["desired"])
        workers.add_metric(["active"], s["workers"]["active"])
        workers.add_metric(["spare"], (s.get("spares") or {}).get("parked", 0))
        yield workers
        yield CounterMetricFamily("flextrain_rendezvous_rounds", "Rendezvous rounds formed", value=s["rounds"])
        if tasks := s.get("tasks"):
            family = GaugeMetricFamily("flextrain_tasks", "Data tasks by state", labels=["state"])
            for state in ("todo", "doing", "done"):
                family.add_metric([state], tasks[state])
            yield family
        relaunches = CounterMetricFamily("flextrain_relaunches", "Workers relaunched, by cause", labels=["cause"])
        for cause, n in sorted((s.get("relaunches") or {}).items()):
            relaunches.add_metric([cause], n)
        yield relaunches
        yield CounterMetricFamily("flextrain_unauthenticated_calls", "Calls to the master refused for lacking the "
                                  "job's token (--tls)", value=s.get("unauthenticatedCalls", 0))
        yield from _evaluation(s)
        yield from _ps_traffic(s.get("psTraffic"))


def _evaluation(s: dict) -> Iterator:
    evaluations = s.get("evaluations") or []
    if not evaluations:
        return
    last = evaluations[-1]
    family = GaugeMetricFamily("flextrain_evaluation", "The latest evaluation's metrics", labels=["metric"])
    for name, value in sorted(last["metrics"].items()):
        if (number := _number(value)) is not None:
            family.add_metric([name], number)
    yield family
    yield GaugeMetricFamily("flextrain_evaluation_step", "The step the latest evaluation evaluated", value=last["step"])


def _ps_traffic(traffic: dict | None) -> Iterator:
    """Parameter-server calls as the workers timed them: count and seconds (a summary: average latency is
    rate(sum) / rate(count)) and bytes moved, for pushes and pulls."""
    if not traffic:
        return
    for kind, calls in (("push", "pushes"), ("pull", "pulls")):
        yield SummaryMetricFamily(f"flextrain_ps_{kind}_seconds", f"Parameter-server {calls} as the workers timed them",
                                  count_value=traffic[calls], sum_value=traffic[f"{kind}Seconds"])
        yield CounterMetricFamily(f"flextrain_ps_{kind}_bytes", f"Bytes the workers' parameter-server {calls} moved",
                                  value=traffic[f"{kind}Bytes"])


def start_metrics(spec, *, host: str, kubernetes_job: dict | None = None, note=lambda message: None
                  ) -> JobMetrics | None:
    """The job's metrics endpoint, serving (None with ``--no-metrics``). Locally on ``host`` (port 0: a free
    one); on Kubernetes on every interface at the ElasticJob's metrics port, shown as the master Service's
    address. A port that cannot be bound is noted and the job goes on without metrics: training matters more."""
    if not spec.metrics:
        return None
    metrics = JobMetrics()
    if kubernetes_job is not None:
        from flextrain.k8s import meta

        md = kubernetes_job["metadata"]
        port, bind = meta.metrics_port(kubernetes_job) or meta.METRICS_PORT, "0.0.0.0"
        shown = f"{meta.master_service_name(md['name'])}.{md['namespace']}.svc"
    else:
        port, bind, shown = spec.metrics_port, host, None
    try:
        metrics.serve(host=bind, port=port, shown_host=shown)
    except OSError as exc:
        note(f"no Prometheus metrics: cannot listen on {bind}:{port} ({exc.strerror or exc}; --metrics-port)")
        return None
    return metrics


__all__ = ["JobMetrics", "SECONDS_BUCKETS", "start_metrics"]
