"""Run a real master with the Kubernetes pod backend against the emulator and the node agent.

``kube_job(**jobspec_fields)`` -> :class:`KubeJob`: an ElasticJob (created
through the real client, so it has a uid) and its master Service (clusterIP
127.0.0.1, a free port: every "pod" shares this host), plus the JobSpec the
master runs. ``job.start()`` runs ``run_master`` in a thread with the pod
backend chosen by ``spec.backend == kubernetes``; ``job.wait()`` returns its
exit code. Helpers read the job's pods and the ElasticJob's status.

``slow_digits``: tests/k8s/e2e/zoo/slow_digits.py (a fixed cost per batch) as ``model_def``, with the
``pod_fields`` that lift that cost once the file ``calm`` exists (a test touches it after its events).
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from ft_helpers import DIGITS_MODEL, free_port
from kubernetes import client

from flextrain.job import Backend, JobSpec
from flextrain.k8s import meta
from flextrain.k8s.resource import resource_from_jobspec

NS = "default"
SLOW_DIGITS = Path(__file__).resolve().parents[1] / "e2e" / "zoo" / "slow_digits.py"


class KubeJob:
    def __init__(self, api, spec: JobSpec, port: int) -> None:
        self.api, self.spec, self.port = api, spec, port
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.code: int | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> KubeJob:
        from flextrain.master.main import run_master

        def run() -> None:
            try:
                self.code = run_master(self.spec, host="127.0.0.1", port=self.port, namespace=NS,
                                       api_client=self.api)
            except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
                self.error = exc

        self._thread = threading.Thread(target=run, daemon=True, name=f"master-{self.spec.name}")
        self._thread.start()
        return self

    def wait(self, timeout: float = 240) -> int:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"master of {self.spec.name} still running after {timeout}s"
        if self.error is not None:
            raise self.error
        return self.code

    def stop(self, reason: str) -> None:
        """Ask the master to stop (its Stop RPC, as `flextrain stop` does)."""
        import grpc

        from flextrain.proto import flextrain_pb2 as pb
        from flextrain.proto import flextrain_pb2_grpc as pb_grpc

        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            try:
                pb_grpc.MasterStub(channel).Stop(pb.StopRequest(reason=reason), timeout=10)
            except grpc.RpcError:
                pass

    def pods(self, role: str = "worker") -> list[dict]:
        items = self.core.list_namespaced_pod(NS).to_dict()["items"]
        return [p for p in items if (p["metadata"]["labels"] or {}).get(meta.LABEL_JOB) == self.spec.name
                and p["metadata"]["labels"].get(meta.LABEL_ROLE) == role]

    def raw_pods(self, role: str = "worker") -> list[dict]:
        import json

        data = json.loads(self.core.list_namespaced_pod(NS, _preload_content=False).data)
        return [p for p in data["items"] if p["metadata"].get("labels", {}).get(meta.LABEL_JOB) == self.spec.name
                and p["metadata"]["labels"].get(meta.LABEL_ROLE) == role]

    def resource(self) -> dict:
        return self.custom.get_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, self.spec.name)

    def status(self) -> dict:
        return self.resource().get("status") or {}


@pytest.fixture
def kube_job(k8s_cluster, k8s_api, digits_data, tmp_path):
    jobs: list[KubeJob] = []

    def make(name: str = "digits", *, pod_fields=None, **fields) -> KubeJob:
        values = {"model_def": DIGITS_MODEL, "training_data": str(digits_data / "train"), "workers": 2,
                  "epochs": 1, "global_batch_size": 64, "max_micro_batch": 32, "learning_rate": 0.1,
                  "rendezvous_timeout": 3.0, **fields}
        spec = JobSpec.of(name=name, job_dir=str(tmp_path / name), backend=Backend.KUBERNETES, **values).validate()
        port = free_port()
        body = resource_from_jobspec(spec, image="flextrain:test", namespace=NS, pod_fields=pod_fields)
        body["metadata"]["annotations"] = {meta.ANNOTATION_MASTER_PORT: str(port)}
        job = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
            meta.GROUP, meta.VERSION, NS, meta.PLURAL, body)
        from flextrain.k8s.master_pod import master_service

        client.CoreV1Api(k8s_api).create_namespaced_service(NS, master_service(job))
        kj = KubeJob(k8s_api, spec, port)
        jobs.append(kj)
        return kj

    yield make
    for kj in jobs:  # a failed test must not leave a master thread launching pods
        if kj._thread is not None and kj._thread.is_alive():
            kj.stop("test teardown")
            kj._thread.join(60)


@pytest.fixture
def slow_digits(tmp_path):
    calm = tmp_path / "calm"
    return SimpleNamespace(model_def=f"{SLOW_DIGITS}:Model", calm=calm,
                           pod_fields={"replicaSpecs.worker.env": [{"name": "FT_SLOW_FEED_UNTIL", "value": str(calm)}]})
