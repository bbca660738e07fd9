"""The real operator (kopf) in-process, and ElasticJob helpers, for tests/k8s/operator and tests/k8s/e2e.

:class:`Operator` runs :func:`flextrain.operator.main.run_operator` in a thread
with its own event loop, logged in through the same ApiClient the handlers
use, and stops it through kopf's stop flag. :class:`Jobs` creates and reads
ElasticJobs, their master pods, Services and Events with the real client.
"""

from __future__ import annotations

import json
import threading

from flextrain.k8s import meta
from flextrain.operator.kube import Kube


class Operator:
    def __init__(self, api_client, namespace: str, *, sweep_interval: float, **options) -> None:
        from flextrain.operator.main import run_operator
        from flextrain.operator.metrics import OperatorMetrics

        self.metrics = OperatorMetrics()  # served on a free port: self.metrics.port once started
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                run_operator(api_client, namespaces=[namespace], stop_flag=self.stop, ready_flag=self.ready,
                             sweep_interval=sweep_interval, metrics_port=0, metrics=self.metrics, **options)
            except BaseException as exc:  # noqa: BLE001 - surfaced by start()/close()
                self.error = exc
                self.ready.set()

        self.thread = threading.Thread(target=run, daemon=True, name="flextrain-operator")

    def start(self) -> Operator:
        self.thread.start()
        assert self.ready.wait(30), "the operator did not become ready"
        assert self.error is None, f"the operator failed to start: {self.error!r}"
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the operator did not stop"
        assert self.error is None, f"the operator crashed: {self.error!r}"


class Jobs:
    """ElasticJobs and their objects, through the real kubernetes client."""

    def __init__(self, api_client, namespace: str) -> None:
        self.kube = Kube(api_client)
        self.namespace = namespace

    def create(self, body: dict) -> dict:
        body = {**body, "metadata": {**body["metadata"], "namespace": self.namespace}}
        # Raw reply: the emulator answers 200 where a real API server answers 201, and the
        # typed client maps only 201 to a body.
        reply = self.kube.custom.create_namespaced_custom_object(
            meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL, body, _preload_content=False)
        return json.loads(reply.data)

    def get(self, name: str) -> dict | None:
        return self.kube.get_job(self.namespace, name)

    def status(self, name: str) -> dict:
        return (self.get(name) or {}).get("status") or {}

    def patch(self, name: str, patch: dict) -> dict:
        return self.kube.patch_spec(self.namespace, name, patch)

    def master_pods(self, name: str) -> dict[int, dict]:
        return self.kube.master_pods(self.namespace, name)

    def service(self, name: str) -> dict | None:
        return self.kube.get_service(self.namespace, meta.master_service_name(name))

    def events(self, name: str) -> list[dict]:
        return self.kube.events(self.namespace, name)

    def reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.events(name)]
