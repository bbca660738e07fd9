"""KubernetesPodBackend on its own: pods created through the API, exits reported exactly once."""

from __future__ import annotations

import threading

import pytest
from ft_helpers import wait_for
from kubernetes import client

from flextrain.k8s import meta
from flextrain.master.k8s_backend import KILLED, KubernetesPodBackend, LaunchError
from flextrain.master.launcher import InstanceSpec, Role

NS = "default"
BAD_ARGS = ("worker", "--no-such-flag")  # argparse refuses it: exit code 2
UNREACHABLE = ("worker", "--master", "127.0.0.1:1", "--worker-id", "worker-0")  # retries for a long time


@pytest.fixture
def elasticjob(k8s_api):
    body = {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": "tiny", "namespace": NS},
            # tls off: no operator here makes the job's Secret, which pods with TLS on would mount
            "spec": {"image": "flextrain:test", "modelDef": "m.py:M", "data": {"training": "/d"}, "tls": False}}
    return client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(meta.GROUP, meta.VERSION, NS,
                                                                            meta.PLURAL, body)


class Exits:
    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, instance_id, code):
        with self.lock:
            self.calls.append((instance_id, code))

    def of(self, instance_id):
        with self.lock:
            return [c for i, c in self.calls if i == instance_id]


@pytest.fixture
def backend(k8s_api, elasticjob, node_agent):
    exits = Exits()
    b = KubernetesPodBackend(k8s_api, job=elasticjob, master_address="127.0.0.1:1")
    b.on_exit(exits)
    b.exits = exits
    yield b.start()
    b.close(grace=0)


def raw_pod(core, name):
    import json

    try:
        return json.loads(core.read_namespaced_pod(name, NS, _preload_content=False).data)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_exit_code_is_reported_exactly_once(backend, k8s_api):
    backend.launch(InstanceSpec("worker-0", Role.WORKER, 0, BAD_ARGS))
    assert "worker-0" in backend.running()
    wait_for(lambda: backend.exits.of("worker-0"), timeout=60, what="worker-0 exit")
    assert backend.exits.of("worker-0") == [2]
    assert backend.running() == set()
    # a watch reconnect replays the pod as ADDED, and a later deletion sends DELETED: no second report
    pod = raw_pod(client.CoreV1Api(k8s_api), "tiny-worker-0")
    backend._on_pod("ADDED", pod)
    backend._on_pod("DELETED", pod)
    assert backend.exits.of("worker-0") == [2]


def test_deleted_pod_reports_137_and_a_relaunch_reuses_the_name(backend, k8s_api, node_agent):
    core = client.CoreV1Api(k8s_api)
    backend.launch(InstanceSpec("ps-0", Role.PS, 0, UNREACHABLE))
    wait_for(lambda: "tiny-ps-0" in node_agent.running(), timeout=30, what="ps pod running")
    svc = core.read_namespaced_service(meta.ps_service_name("tiny", 0), NS).to_dict()
    assert svc["spec"]["selector"] == {meta.LABEL_JOB: "tiny", meta.LABEL_ROLE: "ps", meta.LABEL_INDEX: "0"}
    assert svc["metadata"]["owner_references"][0]["name"] == "tiny"
    first_uid = raw_pod(core, "tiny-ps-0")["metadata"]["uid"]
    backend.terminate("ps-0", force=True)
    wait_for(lambda: backend.exits.of("ps-0"), timeout=30, what="ps-0 exit")
    assert backend.exits.of("ps-0") == [KILLED]
    # a PS is relaunched under the same instance id, hence the same pod name
    backend.launch(InstanceSpec("ps-0", Role.PS, 0, BAD_ARGS))
    wait_for(lambda: len(backend.exits.of("ps-0")) == 2, timeout=60, what="relaunched ps-0 exit")
    assert backend.exits.of("ps-0") == [KILLED, 2]
    assert raw_pod(core, "tiny-ps-0")["metadata"]["uid"] != first_uid


def test_a_new_master_removes_the_pods_of_the_previous_one(k8s_api, elasticjob, node_agent):
    first = KubernetesPodBackend(k8s_api, job=elasticjob, master_address="127.0.0.1:1").start()
    first.launch(InstanceSpec("worker-0", Role.WORKER, 0, UNREACHABLE))
    wait_for(lambda: "tiny-worker-0" in node_agent.running(), timeout=30, what="worker pod running")
    first._watch.stop()  # the old master dies without cleaning up
    first._stopped.set()  # (and its resync thread with it)
    second = KubernetesPodBackend(k8s_api, job=elasticjob, master_address="127.0.0.1:1").start()
    try:
        wait_for(lambda: "tiny-worker-0" not in node_agent.running(), timeout=30, what="stale worker killed")
        exits = Exits()
        second.on_exit(exits)
        second.launch(InstanceSpec("worker-0", Role.WORKER, 0, BAD_ARGS))
        wait_for(lambda: exits.of("worker-0"), timeout=60, what="new worker-0 exit")
        assert exits.of("worker-0") == [2]
    finally:
        second.close(grace=0)


def test_launch_while_running_is_refused(backend, node_agent):
    backend.launch(InstanceSpec("worker-0", Role.WORKER, 0, UNREACHABLE))
    with pytest.raises(LaunchError, match="worker-0 is already running as pod tiny-worker-0"):
        backend.launch(InstanceSpec("worker-0", Role.WORKER, 0, UNREACHABLE))


def test_close_deletes_every_pod_and_reports_each_exit(backend, k8s_api, node_agent):
    for i in range(2):
        backend.launch(InstanceSpec(f"worker-{i}", Role.WORKER, i, UNREACHABLE))
    wait_for(lambda: {"tiny-worker-0", "tiny-worker-1"} <= node_agent.running(), timeout=30, what="pods running")
    backend.close(grace=0)
    assert backend.running() == set()
    assert sorted(backend.exits.calls) == [("worker-0", KILLED), ("worker-1", KILLED)]
    core = client.CoreV1Api(k8s_api)
    wait_for(lambda: raw_pod(core, "tiny-worker-0") is None and raw_pod(core, "tiny-worker-1") is None,
             timeout=30, what="pods deleted")


def test_an_unreachable_api_is_waited_for_with_backoff_until_the_instance_is_no_longer_wanted(elasticjob):
    # An API server that went away: launch returns at once and the create is retried in the background.
    from kubernetes import client as k8s

    config = k8s.Configuration()
    config.host = "http://127.0.0.1:9"  # discard port: connection refused
    notes: list[str] = []
    backend = KubernetesPodBackend(k8s.ApiClient(config), job=elasticjob, master_address="m:1",
                                   retry_first=0.05, retry_cap=0.4, on_note=notes.append)
    exits = Exits()
    backend.on_exit(exits)
    backend.launch(InstanceSpec("worker-0", Role.WORKER, 0, BAD_ARGS))
    assert backend.running() == {"worker-0"} and backend.pending() == {"worker-0"}  # waiting, not hung
    wait_for(lambda: backend._instances["worker-0"].attempts >= 5, timeout=30, what="five create attempts")
    assert notes[0].startswith("waiting for the API server: could not reach it")
    assert len(notes) == 1  # the same reason is said once
    backend.terminate("worker-0")
    assert exits.of("worker-0") == [KILLED] and backend.running() == set()


def test_a_deletion_the_watch_missed_is_found_by_the_resync(k8s_api, elasticjob, node_agent):
    backend = KubernetesPodBackend(k8s_api, job=elasticjob, master_address="m:1", resync_interval=0.3)
    exits = Exits()
    backend.on_exit(exits)
    backend.start()
    try:
        backend.launch(InstanceSpec("worker-0", Role.WORKER, 0, UNREACHABLE))
        wait_for(lambda: "tiny-worker-0" in node_agent.running(), timeout=30, what="worker pod running")
        backend._watch.stop()  # the watch is down (a broken connection) while the pod goes away
        client.CoreV1Api(k8s_api).delete_namespaced_pod("tiny-worker-0", NS,
                                                        body=client.V1DeleteOptions(grace_period_seconds=0))
        wait_for(lambda: exits.of("worker-0"), timeout=30, what="exit found by resync")
        assert exits.of("worker-0") == [KILLED]
    finally:
        backend.close(grace=0)


def test_a_replacement_avoids_the_slow_node_and_the_report_is_an_event(backend, k8s_api):
    import json

    core = client.CoreV1Api(k8s_api)
    backend.launch(InstanceSpec("worker-0", Role.WORKER, 0, UNREACHABLE, avoid_nodes=("node-a", "node-b")))
    spec = raw_pod(core, "tiny-worker-0")["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a", "node-b"]}]
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env[meta.ENV_NODE_NAME]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}  # --node-check names it

    backend.report(reason="SlowWorker", message="worker-3 on node node-a is a straggler")
    events = json.loads(core.list_namespaced_event(NS, _preload_content=False).data)["items"]
    (event,) = [e for e in events if e["reason"] == "SlowWorker"]
    assert event["message"] == "worker-3 on node node-a is a straggler" and event["involvedObject"]["name"] == "tiny"
