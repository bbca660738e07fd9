"""ElasticJobStatusWriter: the ElasticJob's status subresource follows the master's snapshots."""

from __future__ import annotations

import threading
import time

from ft_helpers import wait_for
from kubernetes import client

from flextrain.k8s import meta
from flextrain.master.k8s_status import ElasticJobStatusWriter
from flextrain.operator.kube import Kube

NS = "default"


def snapshot(phase="Running", done=0, total=100, active=2, loss=None, message="", completion=None) -> dict:
    return {"name": "tiny", "phase": phase, "message": message, "workers": {"desired": 2, "active": active},
            "epoch": 1, "step": done // 10, "progress": {"recordsDone": done, "recordsTotal": total,
                                                         "percent": round(100.0 * done / total, 1)},
            "metrics": {} if loss is None else {"loss": loss}, "samplesPerSecond": 12.5,
            "startTime": "2026-01-01T00:00:00Z", "completionTime": completion}


def create_job(api):
    body = {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": "tiny", "namespace": NS},
            "spec": {"image": "x"}}
    client.CustomObjectsApi(api).create_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, body)


def status_of(api) -> dict:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, "tiny")
    return obj.get("status") or {}


def test_status_fields_and_conditions_follow_the_job(k8s_api):
    create_job(k8s_api)
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05)
    writer(snapshot(done=40, loss=0.7))
    wait_for(lambda: status_of(k8s_api).get("progress", {}).get("recordsDone") == 40, timeout=10, what="status")
    status = status_of(k8s_api)
    assert status["phase"] == "Running"
    assert status["workers"] == {"desired": 2, "active": 2, "summary": "2/2"}
    assert status["progress"] == {"recordsDone": 40, "recordsTotal": 100, "percent": 40.0, "summary": "40.0%"}
    assert status["metrics"] == {"loss": 0.7} and status["selector"] == meta.selector("tiny", "worker")
    assert "completionTime" not in status
    running = {c["type"]: c for c in status["conditions"]}["Running"]
    assert running["status"] == "True"
    writer(snapshot(phase="Succeeded", done=100, active=0, loss=0.2, message="training finished",
                    completion="2026-01-01T00:05:00Z"))
    assert writer.close()
    status = status_of(k8s_api)
    assert status["phase"] == "Succeeded" and status["message"] == "training finished"
    assert status["completionTime"] == "2026-01-01T00:05:00Z"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Running"]["status"] == "False" and conditions["Succeeded"]["status"] == "True"
    assert conditions["Succeeded"]["message"] == "training finished"


def test_patches_only_when_the_status_changed(k8s_api):
    create_job(k8s_api)
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05)
    for _ in range(20):
        writer(snapshot(done=10))
    wait_for(lambda: writer.writes == 1, timeout=10, what="first write")
    writer(snapshot(done=10))
    assert writer.close()  # nothing new to write
    assert writer.writes == 1


def test_api_errors_are_retried_and_never_raised(k8s_api):
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05)
    writer(snapshot(done=5))  # the ElasticJob does not exist yet: the API answers 404
    wait_for(lambda: writer.errors >= 2, timeout=10, what="failed writes")
    create_job(k8s_api)
    wait_for(lambda: status_of(k8s_api).get("progress", {}).get("recordsDone") == 5, timeout=10,
             what="status written once the API accepts it")
    assert writer.close()


def test_close_gives_up_after_its_deadline(k8s_api):
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="missing", min_interval=0.05)
    writer(snapshot())
    assert writer.close(timeout=1.0) is False


def test_conditions_written_by_others_are_kept(k8s_api):
    create_job(k8s_api)
    relaunched = {"type": "MasterRelaunched", "status": "True", "reason": "PodFailed",
                  "lastTransitionTime": "2026-01-01T00:01:00Z"}
    client.CustomObjectsApi(k8s_api).patch_namespaced_custom_object_status(
        meta.GROUP, meta.VERSION, NS, meta.PLURAL, "tiny", {"status": {"conditions": [relaunched]}})
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05)
    writer(snapshot(done=10))
    assert writer.close()
    conditions = {c["type"]: c for c in status_of(k8s_api)["conditions"]}
    assert conditions["MasterRelaunched"] == relaunched and conditions["Running"]["status"] == "True"


def test_a_refused_status_is_reported_by_one_warning_event_and_backed_off(k8s_cluster, k8s_api):
    """A validating webhook (or the CRD's schema) refuses the status: the job's Events are the only
    place left to say so -- once per reason, with retries backing off instead of one per tick."""
    create_job(k8s_api)
    webhook = 'admission webhook "status-guard.example.com" denied the request: status.metrics: too many entries'
    lift = k8s_cluster.admit_patch(lambda res, ns, name, sub, body: (
        (403, "Forbidden", webhook) if sub == "status" and name == "tiny" else None))
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05)
    writer(snapshot(done=5, loss=0.5))
    wait_for(lambda: writer.errors >= 3, timeout=10, what="refused writes")
    assert writer.retry_delay >= 0.05 * 2 ** 3  # backing off
    lift()
    wait_for(lambda: status_of(k8s_api).get("progress", {}).get("recordsDone") == 5, timeout=10,
             what="the status written once the webhook lets it through")
    assert writer.close() and writer.retry_delay == 0.05
    refused = [e for e in Kube(k8s_api).events(NS, "tiny") if e["reason"] == "StatusRefused"]
    assert len(refused) == 1, [e["message"] for e in refused]
    assert refused[0]["type"] == "Warning"
    assert refused[0]["message"].startswith(
        f'cannot patch the status of ElasticJob "tiny": the API server refused it (403 Forbidden): {webhook} '
        "(the master's status, phase Running; retried in "), refused[0]["message"]


def read_job(api) -> dict:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, "tiny")


def test_a_deleted_job_stops_the_master_once_and_is_not_retried(k8s_api, caplog):
    """kubectl delete --cascade=orphan: the master's job is gone (404). Not a refusal to back off from and
    report on the deleted object: the master is told once, and nothing more is written."""
    create_job(k8s_api)
    told = []
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05, job=read_job(k8s_api),
                                    on_gone=told.append)
    writer(snapshot(done=10))
    wait_for(lambda: writer.writes == 1, timeout=10, what="the first write")
    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, "tiny")
    writer(snapshot(done=20))
    wait_for(lambda: told, timeout=10, what="the master told its job is gone")
    writer(snapshot(done=30))
    assert writer.close(timeout=1.0)  # nothing left to write to: no retries until the deadline
    assert told == ["the ElasticJob default/tiny is gone: it was deleted (the API server answers 404 Not Found)"]
    assert writer.errors == 0 and writer.writes == 1
    assert "StatusRefused" not in [e["reason"] for e in Kube(k8s_api).events(NS, "tiny")]
    assert any("is gone" in r.getMessage() and "stops the job" in r.getMessage() for r in caplog.records)


def test_a_job_recreated_under_the_same_name_is_not_the_masters(k8s_api):
    create_job(k8s_api)
    told = []
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05, job=read_job(k8s_api),
                                    on_gone=told.append)
    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, "tiny")
    create_job(k8s_api)  # another job of that name: its status is not this master's to write
    writer(snapshot(done=10))
    wait_for(lambda: told, timeout=10, what="the master told its job is gone")
    assert writer.close(timeout=1.0) and "another ElasticJob of its name" in told[0]
    assert status_of(k8s_api) == {}


def test_the_backoff_is_waited_in_full_while_snapshots_keep_coming(k8s_cluster, k8s_api):
    """The reporter offers a snapshot every second or so; each used to wake the writer and retry at once,
    so a refused status was retried every second while the log said 'retried in 60s'."""
    create_job(k8s_api)
    lift = k8s_cluster.admit_patch(lambda res, ns, name, sub, body: (
        (403, "Forbidden", "denied") if sub == "status" and name == "tiny" else None))
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.2)
    pace = threading.Event()
    deadline = time.monotonic() + 2.0
    done = 0
    while time.monotonic() < deadline:  # snapshots every 20 ms (the reporter's cadence, faster)
        done += 1
        writer(snapshot(done=done % 100))
        pace.wait(0.02)
    # tries at about 0, 0.4 and 1.2 s (the delay doubles from 0.2 s); one per snapshot without the fix
    assert 2 <= writer.errors <= 4, writer.errors
    lift()
    assert writer.close()


def test_observed_generation_is_the_spec_the_master_read(k8s_api):
    body = {"apiVersion": meta.API_VERSION, "kind": meta.KIND,
            "metadata": {"name": "tiny", "namespace": NS, "generation": 3}, "spec": {"image": "x"}}
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(meta.GROUP, meta.VERSION, NS, meta.PLURAL, body)
    job = read_job(k8s_api)
    assert job["metadata"]["generation"] == 3  # the emulator keeps it (it sets none of its own)
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05, job=job)
    writer(snapshot(done=10))
    assert writer.close()
    assert status_of(k8s_api)["observedGeneration"] == 3


def test_no_observed_generation_without_a_generation(k8s_api):
    create_job(k8s_api)
    writer = ElasticJobStatusWriter(k8s_api, namespace=NS, name="tiny", min_interval=0.05, job=read_job(k8s_api))
    writer(snapshot(done=10))
    assert writer.close()
    assert "observedGeneration" not in status_of(k8s_api)
