"""An ElasticJob end to end: operator -> master pod -> worker pods -> training on digits -> Succeeded.

Everything that runs is real: kopf and the operator in-process, the API server
emulated by kmock, and the node agent running each Pod's command as a local
process (the master pod runs ``flextrain master --job ... --namespace ...``,
which launches worker pods through the API). Each job's master listens on a
free port (annotation ``flextrain.dev/master-port``): every "pod" shares this host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ft_helpers import DIGITS_MODEL, free_port, read_status, wait_for

from flextrain.k8s import meta

pytestmark = pytest.mark.e2e

RECORDS = 1438  # digits training records
# Digits with a fixed cost per step: long enough for pods to come and go during training; a test lifts
# it (``calm``) once its events are over, so the rest of the job trains at full speed.
SLOW_MODEL = f"{Path(__file__).resolve().parent / 'zoo' / 'slow_digits.py'}:Model"


def elasticjob(name, digits_data, job_dir, *, epochs, replicas=2, min_replicas=1, max_replicas=3,
               checkpoint_steps=0, master_budget=3, model=DIGITS_MODEL, calm: Path | None = None) -> dict:
    """The ElasticJob manifest; with ``calm``, SLOW_MODEL's delay ends once that file exists."""
    worker_env = [{"name": "FT_SLOW_FEED_UNTIL", "value": str(calm)}] if calm else []
    return {
        "apiVersion": meta.API_VERSION, "kind": meta.KIND,
        "metadata": {"name": name, "annotations": {meta.ANNOTATION_MASTER_PORT: str(free_port())}},
        "spec": {
            "image": "flextrain:test", "modelDef": model, "jobDir": str(job_dir),
            "data": {"training": str(digits_data / "train"), "validation": str(digits_data / "validation")},
            "training": {"epochs": epochs, "globalBatchSize": 64, "maxMicroBatch": 32, "learningRate": 0.1,
                         "checkpointSteps": checkpoint_steps},
            "replicaSpecs": {
                "master": {"relaunchBudget": master_budget},
                "worker": {"replicas": replicas, "minReplicas": min_replicas, "maxReplicas": max_replicas,
                           "rendezvousTimeout": 3.0, **({"env": worker_env} if worker_env else {})},
            },
        },
    }


def run_cli(k8s_cluster, jobs, *args) -> str:
    """``flextrain ARGS --namespace NS`` against the emulated cluster; its output (it must succeed)."""
    import os
    import subprocess

    from ft_helpers import flextrain_cmd

    env = {**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)}
    res = subprocess.run(flextrain_cmd(*args, "--namespace", jobs.namespace), capture_output=True, text=True,
                         timeout=120, env=env, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


def pods_of(jobs, name: str, role: str | None = None) -> list[dict]:
    data = json.loads(jobs.kube.core.list_namespaced_pod(jobs.namespace, _preload_content=False).data)
    return [p for p in data["items"] if (p["metadata"].get("labels") or {}).get(meta.LABEL_JOB) == name
            and (role is None or p["metadata"]["labels"].get(meta.LABEL_ROLE) == role)]


def wait_phase(jobs, node_agent, name: str, phase: str, *, timeout: float) -> dict:
    def check():
        st = jobs.status(name)
        if st.get("phase") == "Failed" and phase != "Failed":
            masters = sorted(p["metadata"]["name"] for p in pods_of(jobs, name, "master"))
            logs = "\n".join(f"--- {m}\n{node_agent.log(m)[-3000:]}" for m in masters)
            raise AssertionError(f"job {name} failed: {st.get('message')}\n{logs}")
        return st if st.get("phase") == phase else None
    return wait_for(check, timeout=timeout, what=f"job {name} {phase}")


def assert_owned_by(jobs, name: str, uid: str) -> None:
    pods = pods_of(jobs, name)
    raw = json.loads(jobs.kube.core.list_namespaced_service(jobs.namespace, _preload_content=False).data)
    services = [s for s in raw["items"] if (s["metadata"].get("labels") or {}).get(meta.LABEL_JOB) == name]
    assert pods and services
    for obj in pods + services:
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"], r["uid"]) for r in refs] == [("ElasticJob", name, uid)], obj["metadata"]


def test_elasticjob_trains_to_success_with_status_and_events(operator, node_agent, jobs, digits_data, tmp_path):
    # Slow batches: the job stays Running long enough for the operator to see (and report) the phase.
    calm = tmp_path / "calm"
    job = jobs.create(elasticjob("digits", digits_data, tmp_path / "digits", epochs=3, model=SLOW_MODEL, calm=calm))
    wait_phase(jobs, node_agent, "digits", "Running", timeout=180)
    calm.touch()
    status = wait_phase(jobs, node_agent, "digits", "Succeeded", timeout=300)
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 3 * RECORDS
    assert status["progress"]["percent"] == 100.0
    assert status["metrics"]["accuracy"] > 0.8
    assert status["masterRelaunches"] == 0
    reasons = wait_for(lambda: (r := jobs.reasons("digits")) and "JobSucceeded" in r and r,
                       timeout=30, what="the JobSucceeded event")
    assert reasons.index("MasterCreated") < reasons.index("JobRunning") < reasons.index("JobSucceeded")
    assert_owned_by(jobs, "digits", job["metadata"]["uid"])
    assert {p["metadata"]["name"] for p in pods_of(jobs, "digits")} == {
        "digits-master-0", "digits-worker-0", "digits-worker-1"}
    # The master pod exits 0 once its workers are gone.
    wait_for(lambda: pods_of(jobs, "digits", "master")[0]["status"]["phase"] == "Succeeded",
             timeout=60, what="the master pod to succeed")


def test_scale_subresource_and_a_deleted_worker_pod_while_training(operator, node_agent, jobs, digits_data,
                                                                   tmp_path):
    from flextrain.k8s.meta import GROUP, PLURAL, VERSION

    epochs, calm = 60, tmp_path / "calm"
    jobs.create(elasticjob("digits", digits_data, tmp_path / "digits", epochs=epochs, model=SLOW_MODEL, calm=calm))
    wait_for(lambda: jobs.status("digits").get("workers", {}).get("active") == 2, timeout=180,
             what="a round of 2 workers")
    # What `kubectl scale ej/digits --replicas=3` does: write the scale subresource.
    jobs.kube.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, jobs.namespace, PLURAL, "digits",
                                                          {"spec": {"replicas": 3}})
    assert jobs.get("digits")["spec"]["replicaSpecs"]["worker"]["replicas"] == 3
    wait_for(lambda: jobs.status("digits").get("workers", {}).get("active") == 3, timeout=180,
             what="a round of 3 workers after scaling")
    assert jobs.status("digits").get("phase") == "Running"  # scaled while training, no restart
    scale = jobs.kube.custom.get_namespaced_custom_object_scale(GROUP, VERSION, jobs.namespace, PLURAL, "digits")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == "flextrain.dev/job=digits,flextrain.dev/role=worker"

    before = {p["metadata"]["name"] for p in pods_of(jobs, "digits", "worker")}
    jobs.kube.core.delete_namespaced_pod("digits-worker-0", jobs.namespace, grace_period_seconds=0)
    # A new name, whether or not the deleted pod's object is still there (its count alone raced that).
    wait_for(lambda: {p["metadata"]["name"] for p in pods_of(jobs, "digits", "worker")} - before, timeout=120,
             what="a replacement for the deleted worker pod")
    calm.touch()
    status = wait_phase(jobs, node_agent, "digits", "Succeeded", timeout=400)
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == epochs * RECORDS
    names = {p["metadata"]["name"] for p in pods_of(jobs, "digits", "worker")}
    assert "digits-worker-0" not in names and len(names) == 3
    assert "Scaling" in jobs.reasons("digits")


def test_deleted_master_pod_is_relaunched_and_resumes_from_its_checkpoint(operator, node_agent, jobs,
                                                                         digits_data, tmp_path):
    job_dir = tmp_path / "digits"
    epochs, calm = 40, tmp_path / "calm"
    jobs.create(elasticjob("digits", digits_data, job_dir, epochs=epochs, checkpoint_steps=10, model=SLOW_MODEL,
                           calm=calm))
    latest = job_dir / "checkpoints" / "latest.json"
    wait_for(latest.is_file, timeout=240, what="the job's first checkpoint")
    jobs.kube.core.delete_namespaced_pod("digits-master-0", jobs.namespace)  # graceful: SIGTERM
    wait_for(lambda: 1 in jobs.master_pods("digits"), timeout=120, what="the relaunched master pod")
    assert 0 not in jobs.master_pods("digits")  # the deleted pod is gone (its exit code is in the event)
    calm.touch()

    status = wait_phase(jobs, node_agent, "digits", "Succeeded", timeout=500)
    assert status["masterRelaunches"] == 1
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == epochs * RECORDS
    notes = json.dumps(read_status(job_dir)["events"])  # the master's notes in status.json
    assert "resumed from" in notes, notes  # the new master continued from the checkpoint, not from scratch
    relaunched = [e for e in jobs.events("digits") if e["reason"] == "MasterRelaunched"]
    assert len(relaunched) == 1 and "master pod digits-master-0 " in relaunched[0]["message"]
    # On SIGTERM the master left without concluding the job, which is why it could be relaunched.
    assert "signal 15: leaving without concluding the job" in node_agent.log("digits-master-0")


def test_scale_down_and_stop_through_the_cli(operator, node_agent, jobs, digits_data, tmp_path, k8s_cluster,
                                            caplog):
    import logging

    caplog.set_level(logging.INFO, logger="flextrain.operator.handlers")

    def cli(*args):
        return run_cli(k8s_cluster, jobs, *args)

    job_dir = tmp_path / "digits"
    jobs.create(elasticjob("digits", digits_data, job_dir, epochs=60, replicas=3, model=SLOW_MODEL))
    wait_for(lambda: jobs.status("digits").get("workers", {}).get("active") == 3, timeout=240,
             what="a round of 3 workers")
    cli("scale", "digits", "2")
    wait_for(lambda: jobs.status("digits").get("workers", {}).get("active") == 2, timeout=180,
             what="a round of 2 workers after scaling down")
    gone = wait_for(lambda: [p for p in pods_of(jobs, "digits", "worker") if p["status"]["phase"] == "Succeeded"],
                    timeout=120, what="the scaled-away worker to exit")
    assert len(gone) == 1  # it left cleanly (exit 0), not killed
    assert jobs.status("digits")["phase"] == "Running"

    cli("stop", "digits", "--reason", "enough for today")
    status = wait_phase(jobs, node_agent, "digits", "Failed", timeout=180)
    assert status["message"].startswith("stopped: enough for today"), status["message"]
    assert status["progress"]["recordsDone"] < status["progress"]["recordsTotal"]
    assert (job_dir / "checkpoints" / "latest.json").is_file()  # the stop left a checkpoint to resume from
    assert "phase     Failed  - stopped: enough for today" in cli("status", "digits")
    assert "StopRequested" in jobs.reasons("digits")
    wait_for(lambda: any("master pod digits-master-0" in r.getMessage() and "job digits over" in r.getMessage()
                         for r in caplog.records), timeout=120, what="the operator's decision on the master's exit")
    assert list(jobs.master_pods("digits")) == [0]  # a stopped job's master is not relaunched
    assert jobs.status("digits")["masterRelaunches"] == 0


def test_a_module_failing_in_the_worker_pods_fails_the_job_with_its_error(operator, node_agent, jobs, digits_data,
                                                                          tmp_path):
    """The user's own exception, raised only in worker pods (preflight passes), is the job's reason:
    phase Failed within seconds, ``status.failure`` naming exception and line, a Warning event."""
    from ft_helpers import MODEL_ZOO

    module = tmp_path / "ctor.py"
    module.write_text((MODEL_ZOO / "digits_torch.py").read_text().replace(
        "        super().__init__()\n",
        "        super().__init__()\n"
        "        import os\n"
        "        if os.environ.get('FLEXTRAIN_WORKER_ID'):\n"
        "            raise RuntimeError('cannot build model: missing vocab file')\n"))
    spec = elasticjob("broken", digits_data, tmp_path / "broken", epochs=1, model=f"{module}:Model")
    spec["spec"]["replicaSpecs"]["worker"]["minWorkersTimeout"] = 600  # it must not be what ends the job
    jobs.create(spec)
    status = wait_phase(jobs, node_agent, "broken", "Failed", timeout=120)
    failure = status["failure"]
    assert failure["kind"] == "UserCode" and failure["exception"] == "RuntimeError"
    assert failure["message"] == "cannot build model: missing vocab file"
    assert failure["location"].startswith(f"{module}:")
    assert failure["log"].startswith("kubectl logs -n ")
    assert "cannot build model: missing vocab file" in status["message"]
    events = wait_for(lambda: [e for e in jobs.events("broken") if e.get("reason") == "JobFailed"],
                      timeout=30, what="the JobFailed event")
    assert events[0]["type"] == "Warning" and "missing vocab file" in events[0]["message"]
