"""Worker pods the API server refuses, and workers that crash before they are ready.

A refusal is made by the emulator's admission hook (tests/k8s/conftest.py), answering as a real
API server's admission does: the Status body's ``message`` is what the job must report.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from ft_helpers import read_status, wait_for

NS = "default"


class Refuse:
    """An admission hook refusing creates of pods whose name starts with ``prefix``; it records
    the time of every attempt by pod name."""

    def __init__(self, prefix: str, *, code: int, reason: str, message: str) -> None:
        self.prefix, self.code, self.reason, self.message = prefix, code, reason, message
        self.attempts: dict[str, list[float]] = {}
        self.lock = threading.Lock()

    def __call__(self, resource, namespace: str | None, obj: dict) -> tuple[int, str, str] | None:
        name = (obj.get("metadata") or {}).get("name", "")
        if resource != "v1/pods" or not name.startswith(self.prefix):
            return None
        with self.lock:
            self.attempts.setdefault(name, []).append(time.monotonic())
        return self.code, self.reason, self.message.format(name=name)

    def of(self, name: str) -> list[float]:
        with self.lock:
            return list(self.attempts.get(name, ()))


def admit(cluster, hook) -> None:
    cluster.call(lambda: cluster.emulator.admission.append(hook))


def stop_admitting(cluster, hook) -> None:
    cluster.call(lambda: cluster.emulator.admission.remove(hook))


def warnings_on(job) -> list[dict]:
    data = json.loads(job.core.list_namespaced_event(NS, _preload_content=False).data)
    return [e for e in data["items"] if e["involvedObject"]["name"] == job.spec.name and e["type"] == "Warning"]


@pytest.mark.parametrize("code,reason,message", [
    (422, "Invalid", 'Pod "{name}" is invalid: spec.containers[0].resources.requests: Invalid value: "4": '
                     "must be less than or equal to cpu limit"),
    (403, "Forbidden", 'admission webhook "policy.example.com" denied the request: pod {name} has no cost label'),
])
def test_a_worker_pod_refused_for_good_fails_the_job_naming_pod_and_reason(kube_job, node_agent, k8s_cluster,
                                                                          code, reason, message):
    job = kube_job("refused", workers=2)
    hook = Refuse("refused-worker-1", code=code, reason=reason, message=message)
    admit(k8s_cluster, hook)
    assert job.start().wait(120) != 0
    expected = (f'cannot create pod "refused-worker-1": the API server refused it ({code} {reason}): '
                + message.format(name="refused-worker-1"))
    assert job.status()["phase"] == "Failed" and job.status()["message"] == expected
    assert read_status(Path(job.spec.job_dir))["message"] == expected
    assert len(hook.of("refused-worker-1")) == 1  # a refusal for good is not retried
    assert [e["message"] for e in warnings_on(job) if e["reason"] == "FailedCreate"] == [expected]


def test_a_quota_refusal_waits_with_backoff_and_the_job_starts_once_the_quota_frees(kube_job, node_agent,
                                                                                    k8s_cluster):
    job = kube_job("quota", workers=2)
    hook = Refuse("quota-worker-", code=403, reason="Forbidden",
                  message='pods "{name}" is forbidden: exceeded quota: team-pods, requested: pods=1, '
                          "used: pods=10, limited: pods=10")
    admit(k8s_cluster, hook)
    job.start()
    began = time.monotonic()
    wait_for(lambda: len(hook.of("quota-worker-0")) >= 4, timeout=60, what="four create attempts of quota-worker-0")
    times = hook.of("quota-worker-0")[:4]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[1] > 1.5 * gaps[0] and gaps[2] > 1.5 * gaps[1], gaps  # exponential backoff, no tight loop
    # every pod's attempts over these seconds: a handful, not a loop
    assert sum(len(hook.of(f"quota-worker-{i}")) for i in range(2)) < 10, hook.attempts
    waiting = 'waiting for quota: pods "quota-worker-'
    status = job.status()
    assert status["phase"] == "Pending" and status["message"].startswith(waiting), status
    assert "exceeded quota: team-pods" in status["message"]
    assert read_status(Path(job.spec.job_dir))["message"].startswith(waiting)
    assert [e for e in warnings_on(job) if e["reason"] == "FailedCreate" and e["message"].startswith(waiting)]
    assert time.monotonic() - began < 30  # the attempts above were not minutes apart

    stop_admitting(k8s_cluster, hook)  # the quota frees
    assert job.wait() == 0
    final = read_status(Path(job.spec.job_dir))
    assert final["phase"] == "Succeeded" and job.status()["phase"] == "Succeeded"
    assert any(e.startswith("created pod quota-worker-0 after") for e in final["events"]), final["events"]


def test_a_model_def_missing_from_the_image_fails_the_job_fast_with_the_workers_error(kube_job, node_agent):
    job = kube_job("nomod", model_def="/opt/not-in-image/model.py:Model", workers=2, min_workers=2)
    began = time.monotonic()
    assert job.start().wait(120) != 0
    assert time.monotonic() - began < 60  # far less than the 300 s of minWorkersTimeout
    message = job.status()["message"]
    assert "/opt/not-in-image/model.py not found" in message and "spec.modelDef" in message, message
    assert "--" not in message  # the spec's field names, not flags
    assert job.status()["failure"]["message"].startswith("spec.modelDef ")
    failed = [p["metadata"]["name"] for p in job.raw_pods() if p["status"]["phase"] == "Failed"]
    assert len(failed) <= 2 and len(set(failed)) == len(failed), failed


SELF_KILLING = """import os, signal, sys
print("worker image is missing libfoo.so", file=sys.stderr, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_failed_pods_are_deleted_once_recorded_keeping_the_latest(kube_job, node_agent, tmp_path):
    module = tmp_path / "self_killing.py"
    module.write_text(SELF_KILLING)
    job = kube_job("dies", model_def=f"{module}:Model", workers=1, relaunch_budget=2)
    assert job.start().wait(120) != 0
    # three SIGKILLed workers (an infrastructure kind of failure: relaunched until the budget is spent)
    events = read_status(Path(job.spec.job_dir))["events"]
    assert [e for e in events if e.endswith("exited with code 137 (SIGKILL)")] == [
        f"worker-{i} exited with code 137 (SIGKILL)" for i in range(3)], events
    # the earlier two are deleted (the node agent removes a deleted pod once its process is gone)
    wait_for(lambda: [p["metadata"]["name"] for p in job.raw_pods()] == ["dies-worker-2"], timeout=30,
             what="only the latest failed pod left")
    pods = job.raw_pods()
    message = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"].get("message", "")
    assert "worker image is missing libfoo.so" in message  # FallbackToLogsOnError: kubectl logs has it too
    status = job.status()
    assert "spec.replicaSpecs.worker.minReplicas" in status["message"], status["message"]
    assert "--min-workers" not in status["message"]
