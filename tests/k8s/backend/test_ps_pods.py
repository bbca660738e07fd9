"""ParameterServer jobs through the pod backend: PS pods behind their Services, workers dial the Services.

A real master (``run_master`` with the Kubernetes backend) against the
emulator, every Pod run by the node agent as a local process. Every "pod"
shares this host, so the job is annotated ``flextrain.dev/ps-port-base``:
parameter server i listens on BASE + i and its Service exposes that port
(in a cluster every PS listens on 50061 in its own pod).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
from ft_helpers import MODEL_ZOO, read_status, run_flextrain, wait_for
from least_privilege_checks import assert_pod_least_privileged

from flextrain.job import Strategy
from flextrain.k8s import meta

pytestmark = pytest.mark.e2e

DEEPFM = f"{MODEL_ZOO / 'deepfm_torch.py'}:Model"
NS = "default"


@pytest.fixture(scope="module")
def ctr_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("ctr")
    proc = run_flextrain("data", "ctr", "--out", str(out), "--rows", "5000", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    return out


def free_port_pair() -> int:
    """A port BASE with BASE and BASE + 1 free on loopback."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            if base >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
                return base
    raise RuntimeError("no two consecutive free ports")


def ps_job(kube_job, ctr_data, *, epochs: int):
    job = kube_job("ctr", model_def=DEEPFM, training_data=str(ctr_data / "train"),
                   validation_data=str(ctr_data / "validation"), strategy=Strategy.PARAMETER_SERVER, ps=2,
                   workers=2, epochs=epochs, global_batch_size=128, max_micro_batch=128, learning_rate=0.02,
                   ps_checkpoint_steps=5)
    base = free_port_pair()
    # the backend reads the ElasticJob when the master starts: annotate it before
    job.custom.patch_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, "ctr", {
        "metadata": {"annotations": {meta.ANNOTATION_PS_PORT_BASE: str(base)}}})
    return job, base


def ps_services(job) -> list[dict]:
    data = json.loads(job.core.list_namespaced_service(NS, _preload_content=False).data)
    return sorted((s for s in data["items"] if (s["metadata"].get("labels") or {}).get(meta.LABEL_JOB) == "ctr"
                   and s["metadata"]["labels"].get(meta.LABEL_ROLE) == "ps"), key=lambda s: s["metadata"]["name"])


def test_ps_pods_and_services_are_created_and_workers_train_through_the_services(kube_job, node_agent, ctr_data):
    job, base = ps_job(kube_job, ctr_data, epochs=1)
    uid = job.resource()["metadata"]["uid"]
    job.start()
    # the backend deletes its pods when the job ends: look at them while it runs
    pods = wait_for(lambda: len(p := job.raw_pods("ps")) == 2 and p, timeout=120, what="two PS pods")
    workers = wait_for(lambda: job.raw_pods("worker"), timeout=120, what="worker pods")
    for pod in [*pods, *workers]:  # the master's pods are least-privileged, and train so (flextrain.k8s.hardening)
        assert_pod_least_privileged(pod, token=False, job_dir=job.spec.job_dir)
    assert job.wait(timeout=300) == 0
    assert job.status()["phase"] == "Succeeded", job.status()
    status = read_status(Path(job.spec.job_dir))
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 4000
    assert status["metrics"]["accuracy"] > 0.65, status["metrics"]
    owner = [{"apiVersion": meta.API_VERSION, "kind": meta.KIND, "name": "ctr", "uid": uid, "controller": True,
              "blockOwnerDeletion": True}]

    pods = sorted(pods, key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == ["ctr-ps-0", "ctr-ps-1"]
    for i, pod in enumerate(pods):
        assert pod["metadata"]["ownerReferences"] == owner
        assert pod["metadata"]["labels"][meta.LABEL_INDEX] == str(i)
        (container,) = pod["spec"]["containers"]
        args = container["args"]
        assert args[args.index("--host") + 1] == "0.0.0.0"  # every interface of its pod
        assert args[args.index("--port") + 1] == str(base + i)
        assert "--address-file" not in args  # the Service is its address, not a file in the job dir
        assert container["ports"] == [{"name": "grpc", "containerPort": base + i, "protocol": "TCP"}]

    svcs = ps_services(job)
    assert [s["metadata"]["name"] for s in svcs] == ["ctr-ps-0", "ctr-ps-1"]
    for i, svc in enumerate(svcs):
        assert svc["metadata"]["ownerReferences"] == owner
        assert svc["spec"]["selector"] == {meta.LABEL_JOB: "ctr", meta.LABEL_ROLE: "ps", meta.LABEL_INDEX: str(i)}
        assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(base + i, base + i)]
    # workers were given the Services' addresses (clusterIP:port)
    notes = json.dumps(status["events"])
    assert f"2 parameter server(s) at 127.0.0.1:{base}, 127.0.0.1:{base + 1}" in notes, notes
    for i in range(2):
        assert f"PS {i}/2 listening on 127.0.0.1:{base + i}" in node_agent.log(f"ctr-ps-{i}")  # as advertised


def test_a_killed_ps_pod_is_replaced_restores_its_shard_and_the_job_completes(kube_job, node_agent, ctr_data):
    job, base = ps_job(kube_job, ctr_data, epochs=4)
    job.start()
    wait_for(lambda: job.status().get("progress", {}).get("recordsDone", 0) >= 4000, timeout=180,
             what="the second epoch under way")
    first = next(p for p in job.raw_pods("ps") if p["metadata"]["name"] == "ctr-ps-1")
    os.kill(node_agent.pid("ctr-ps-1"), signal.SIGKILL)  # the PS process crashes: the pod fails with 137

    def replaced():
        pods = [p for p in job.raw_pods("ps") if p["metadata"]["name"] == "ctr-ps-1"]
        return pods and pods[0]["metadata"]["uid"] != first["metadata"]["uid"] and pods[0]
    again = wait_for(replaced, timeout=60, what="a new ctr-ps-1 pod")
    assert again["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
    assert job.wait(timeout=300) == 0
    assert job.status()["phase"] == "Succeeded", job.status()
    status = read_status(Path(job.spec.job_dir))
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 4 * 4000
    assert status["metrics"]["accuracy"] > 0.65, status["metrics"]
    assert "parameter server 1 exited with code 137" in json.dumps(status["events"])
    # the replacement listened on the same port and came back where ps-1 was (checkpoint + log), not from 0
    starts = re.findall(rf"PS 1/2 listening on 127\.0\.0\.1:{base + 1} \(version (\d+)", node_agent.log("ctr-ps-1"))
    assert len(starts) == 2 and int(starts[0]) == 0 and int(starts[1]) > 0, starts
    assert [s["metadata"]["name"] for s in ps_services(job)] == ["ctr-ps-0", "ctr-ps-1"]  # outlived the pod
