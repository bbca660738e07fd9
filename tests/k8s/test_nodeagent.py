"""The test node agent runs Pods created through the real client as processes and reports like a kubelet."""

from __future__ import annotations

import sys
import threading

import pytest
from ft_helpers import wait_for
from kubernetes import client
from nodeagent import HOLD_ANNOTATION

from flextrain.k8s.watch import ObjectWatch

SLEEPER = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
           "print('ready', flush=True)\ntime.sleep(600)")


def pod(name: str, code: str, *, env=(), annotations=None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "flextrain:test", "command": ["python", "-c", code], "env": list(env)}]}}


def read(core, name):
    try:
        return core.read_namespaced_pod(name, "default").to_dict()
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def terminated(core, name):
    p = read(core, name)
    statuses = (p or {}).get("status", {}).get("container_statuses") or []
    return statuses and statuses[0]["state"].get("terminated")


class Recorder:
    """Every pod event seen by a watch, to observe states that do not last (a pod being deleted)."""

    def __init__(self, core):
        self.events: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        self.watch = ObjectWatch(core.list_namespaced_pod, "default", handler=self.add, name="recorder").start()
        assert self.watch.connected.wait(10)

    def add(self, kind, obj):
        with self.lock:
            self.events.append((kind, obj))

    def exit_code(self, name):
        with self.lock:
            for _, obj in self.events:
                if obj["metadata"]["name"] == name:
                    for cs in obj.get("status", {}).get("containerStatuses") or []:
                        if "terminated" in cs.get("state", {}):
                            return cs["state"]["terminated"]["exitCode"]
        return None

    def deleted(self, name):
        with self.lock:
            return any(k == "DELETED" and o["metadata"]["name"] == name for k, o in self.events)


def test_pod_runs_with_env_and_its_exit_code_lands_in_status(k8s_api, node_agent):
    core = client.CoreV1Api(k8s_api)
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "GREETING", "value": "hi $(POD_NAME)"}]
    code = "import os, sys; print(os.environ['GREETING'], os.environ['POD_IP'], sys.executable); sys.exit(3)"
    core.create_namespaced_pod("default", pod("runner", code, env=env))
    state = wait_for(lambda: terminated(core, "runner"), timeout=30, what="runner to terminate")
    assert state["exit_code"] == 3 and state["reason"] == "Error"
    status = read(core, "runner")["status"]
    assert status["phase"] == "Failed" and status["pod_ip"] == "127.0.0.1"
    assert node_agent.log("runner").split() == ["hi", "runner", "127.0.0.1", sys.executable]


def test_successful_pod_completes(k8s_api, node_agent):
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod("default", pod("ok", "pass"))
    state = wait_for(lambda: terminated(core, "ok"), timeout=30, what="ok to terminate")
    assert state["exit_code"] == 0 and state["reason"] == "Completed"
    assert read(core, "ok")["status"]["phase"] == "Succeeded"


def test_forced_delete_kills_the_process_with_137(k8s_api, node_agent):
    core = client.CoreV1Api(k8s_api)
    rec = Recorder(core)
    core.create_namespaced_pod("default", pod("victim", SLEEPER))
    wait_for(lambda: (read(core, "victim") or {}).get("status", {}).get("phase") == "Running", timeout=30,
             what="victim running")
    proc = node_agent._find("victim").proc
    core.delete_namespaced_pod("victim", "default", body=client.V1DeleteOptions(grace_period_seconds=0))
    wait_for(lambda: rec.deleted("victim"), timeout=30, what="victim gone")
    assert proc.wait(10) == -9
    assert rec.exit_code("victim") == 137
    rec.watch.stop()


def test_graceful_delete_sends_sigterm_and_reports_the_exit_code(k8s_api, node_agent):
    core = client.CoreV1Api(k8s_api)
    rec = Recorder(core)
    core.create_namespaced_pod("default", pod("graceful", SLEEPER))
    wait_for(lambda: "ready" in node_agent.log("graceful"), timeout=30, what="graceful's SIGTERM handler")
    core.delete_namespaced_pod("graceful", "default", body=client.V1DeleteOptions(grace_period_seconds=20))
    wait_for(lambda: rec.deleted("graceful"), timeout=30, what="graceful gone")
    assert rec.exit_code("graceful") == 7  # its SIGTERM handler ran
    rec.watch.stop()


def test_oom_kill_is_reported_as_oomkilled(k8s_api, node_agent):
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod("default", pod("hog", SLEEPER))
    wait_for(lambda: "hog" in node_agent.running(), timeout=30, what="hog running")
    node_agent.oom_kill("hog")
    state = wait_for(lambda: terminated(core, "hog"), timeout=30, what="hog to terminate")
    assert (state["exit_code"], state["reason"]) == (137, "OOMKilled")
    assert read(core, "hog")["status"]["phase"] == "Failed"


def test_flextrain_pods_fork_from_the_zygote_once_it_is_ready(k8s_api, node_agent, tmp_path):
    """The first flextrain Pod starts the zygote and runs fresh; one started once the zygote has loaded is
    forked from it, in its own directory, and its exit code and output land where a fresh one's do."""
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod("default", {**pod("first", ""), "spec": {"restartPolicy": "Never", "containers": [
        {"name": "main", "image": "flextrain:test", "args": ["data", "digits", "--out", "d"]}]}})
    wait_for(lambda: terminated(core, "first"), timeout=60, what="first to terminate")
    wait_for(lambda: node_agent._zygote is not None and node_agent._zygote.ready, timeout=120, what="the zygote")
    core.create_namespaced_pod("default", {**pod("second", ""), "spec": {"restartPolicy": "Never", "containers": [
        {"name": "main", "image": "flextrain:test", "args": ["data", "digits", "--out", "d", "--seed", "3"]}]}})
    state = wait_for(lambda: terminated(core, "second"), timeout=60, what="second to terminate")
    assert state["exit_code"] == 0 and state["reason"] == "Completed", node_agent.log("second")
    assert node_agent.forked_pods == ["second"]
    workdir = node_agent.log_dir / "default"
    for name in ("first", "second"):  # each wrote into its own directory
        assert sorted(p.name for p in (workdir / name / "d").iterdir()) == ["train", "validation"]
    for name, env in (("broken", []), ("unserved", [{"name": "PYTHONUNBUFFERED", "value": "1"}])):
        core.create_namespaced_pod("default", {**pod(name, ""), "spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "flextrain:test", "args": ["data", "digits"], "env": env}]}})
        state = wait_for(lambda: terminated(core, name), timeout=60, what=f"{name} to terminate")
        assert state["exit_code"] == 2 and "--out" in node_agent.log(name)  # argparse's exit, its message
    # with PYTHONUNBUFFERED, read as the interpreter starts, unlike the first Pod: it could not be forked
    assert node_agent.forked_pods == ["second", "broken"]


def test_held_pod_stays_pending_until_released(k8s_api, node_agent):
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod("default", pod("held", "pass", annotations={HOLD_ANNOTATION: "true"}))
    wait_for(lambda: any(c["reason"] == "Unschedulable"
                         for c in (read(core, "held")["status"].get("conditions") or [])),
             timeout=30, what="held marked unschedulable")
    assert read(core, "held")["status"]["phase"] == "Pending"
    assert "held" not in node_agent.started_pods
    core.patch_namespaced_pod("held", "default", {"metadata": {"annotations": {HOLD_ANNOTATION: None}}})
    state = wait_for(lambda: terminated(core, "held"), timeout=30, what="released pod to run")
    assert state["exit_code"] == 0


@pytest.mark.parametrize("max_pods", [1])
def test_capacity_limit_keeps_extra_pods_pending(k8s_cluster, k8s_api, tmp_path, max_pods):
    from nodeagent import NodeAgent

    agent = NodeAgent(k8s_cluster.api_client(), kubeconfig=k8s_cluster.kubeconfig, log_dir=tmp_path / "logs",
                      max_pods=max_pods).start()
    try:
        core = client.CoreV1Api(k8s_api)
        core.create_namespaced_pod("default", pod("first", SLEEPER))
        wait_for(lambda: "first" in agent.running(), timeout=30, what="first running")
        core.create_namespaced_pod("default", pod("second", "pass"))
        wait_for(lambda: read(core, "second")["status"].get("conditions"), timeout=30, what="second scheduled?")
        assert read(core, "second")["status"]["phase"] == "Pending"
        agent.oom_kill("first")
        assert wait_for(lambda: terminated(core, "second"), timeout=30, what="second to run")["exit_code"] == 0
    finally:
        agent.close()


def test_kubectl_lists_pods_from_the_emulator(k8s_cluster, k8s_api, node_agent):
    import shutil
    import subprocess

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    client.CoreV1Api(k8s_api).create_namespaced_pod("default", pod("listed", "pass"))
    out = subprocess.run(["kubectl", "--kubeconfig", str(k8s_cluster.kubeconfig), "get", "pods", "-o", "name"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["pod/listed"]
