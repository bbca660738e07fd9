"""`flextrain operator` and `flextrain master` as the processes a cluster runs (KUBECONFIG -> the emulator)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from ft_helpers import flextrain_cmd, wait_for
from test_operator_create import elasticjob

from flextrain.k8s import meta
from flextrain.master.checkpoints import CheckpointStore


@pytest.fixture
def env(k8s_cluster):
    env = {**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig), "PYTHONUNBUFFERED": "1"}
    env.pop(meta.ENV_NAMESPACE, None)
    return env


def run(env, *args, timeout=120):
    return subprocess.run(flextrain_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)


def test_operator_command_logs_in_from_kubeconfig_and_handles_jobs(env, jobs):
    proc = subprocess.Popen(flextrain_cmd("--log-level", "INFO", "operator", "--namespace", "default",
                                          "--sweep-interval", "1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        jobs.create(elasticjob("digits"))
        wait_for(lambda: 0 in jobs.master_pods("digits"), timeout=60, what="the master pod from the operator process")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "flextrain operator watching default" in out


def relaunched_job(jobs, tmp_path, body) -> dict:
    """A job whose first master died: the operator counted a relaunch; the job dir has its files."""
    job_dir = tmp_path / body["metadata"]["name"]
    body["spec"]["jobDir"] = str(job_dir)
    job = jobs.create(body)
    jobs.kube.patch_status(job, {"phase": "Running", "masterRelaunches": 1})
    job_dir.mkdir()
    (job_dir / "jobspec.json").write_text("{}\n")
    return job


def test_relaunched_master_after_the_final_checkpoint_concludes_the_job(env, jobs, tmp_path):
    relaunched_job(jobs, tmp_path, elasticjob("digits"))
    CheckpointStore(tmp_path / "digits" / "checkpoints").record(
        checkpoint=str(tmp_path / "digits" / "checkpoints" / "final.ckpt"), version=42, ledger={}, final=True)
    res = run(env, "master", "--job", "digits", "--namespace", "default", "--port", "0")
    assert res.returncode == 0, res.stderr
    status = jobs.status("digits")
    assert status["phase"] == "Succeeded" and "completionTime" in status
    assert "training finished (final checkpoint" in status["message"] and "final.ckpt" in status["message"]


def test_master_that_cannot_start_fails_the_job_naming_the_problem(env, jobs, tmp_path):
    """Missing data: relaunching cannot help, so the job fails with the reason instead."""
    job = elasticjob("digits")
    job["spec"]["jobDir"] = str(tmp_path / "digits")
    jobs.create(job)
    res = run(env, "master", "--job", "digits", "--namespace", "default", "--port", "0")
    assert res.returncode == 2
    status = jobs.status("digits")
    assert status["phase"] == "Failed"
    assert status["message"] == "the master cannot start: training data directory not found: /data/train"
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert (failed["status"], failed["message"]) == ("True", status["message"])
    assert status["failure"]["kind"] == "Data" and status["failure"]["worker"] == "master"


def test_master_refuses_a_module_that_fails_preflight_before_any_worker_pod(env, jobs, tmp_path, digits_data,
                                                                          k8s_api):
    """The master pod runs the same preflight as `flextrain train`: a broken module fails the job, naming it."""
    from kubernetes import client

    from ft_helpers import MODEL_ZOO

    module = tmp_path / "optnone.py"
    module.write_text((MODEL_ZOO / "digits_torch.py").read_text().replace("    return torch.optim.SGD(",
                                                                          "    torch.optim.SGD("))
    job = elasticjob("digits")
    job["spec"].update(modelDef=f"{module}:Model", jobDir=str(tmp_path / "digits"),
                       data={"training": str(digits_data / "train")})
    job["metadata"]["generation"] = 6  # an API server sets it; the emulator keeps the one given
    created = jobs.create(job)
    jobs.kube.patch_status(created, {"conditions": [  # stale: must not outlive the failure
        {"type": "Running", "status": "True", "reason": "Running", "lastTransitionTime": meta.now_iso()}]})
    res = run(env, "master", "--job", "digits", "--namespace", "default", "--port", "0")
    assert res.returncode == 2, res.stderr
    status = jobs.status("digits")
    assert status["phase"] == "Failed" and "completionTime" in status
    # `kubectl wait --for=condition=Failed` returns; the root cause is in .status.failure
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["status"] == "True" and conditions["Failed"]["message"] == status["message"]
    assert conditions["Running"]["status"] == "False"
    failure = status["failure"]
    assert (failure["kind"], failure["stage"], failure["exception"]) == ("UserCode", "preflight", "PreflightError")
    assert f"{module}: optimizer(params) returned None" in failure["message"]
    assert status["startTime"] <= status["completionTime"] and status["observedGeneration"] == 6
    assert status["message"].startswith(f"the master cannot start: {module}: optimizer(params) returned None")
    assert "spec.training.preflight: false skips it" in status["message"]
    assert client.CoreV1Api(k8s_api).list_namespaced_pod("default").items == []  # no worker pod was made
    assert not (tmp_path / "digits").exists()


def test_master_names_a_missing_module_by_its_spec_field(env, jobs, tmp_path, digits_data):
    """The preflight's message is shared with `flextrain train`, which names --model-def; an ElasticJob's
    user wrote spec.modelDef (docs/kubernetes.md: settings are named by their spec fields)."""
    missing = tmp_path / "nope.py"
    job = elasticjob("digits")
    job["spec"].update(modelDef=f"{missing}:Model", jobDir=str(tmp_path / "digits"),
                       data={"training": str(digits_data / "train")})
    jobs.create(job)
    res = run(env, "master", "--job", "digits", "--namespace", "default", "--port", "0")
    assert res.returncode == 2, res.stderr
    message = jobs.status("digits")["message"]
    assert message.startswith(f"the master cannot start: spec.modelDef '{missing}:Model': module file {missing} "
                              "not found"), message
    assert "--model-def" not in message


def test_master_of_a_missing_job_names_it(env):
    res = run(env, "master", "--job", "nosuch", "--namespace", "default")
    assert res.returncode == 2 and "no ElasticJob 'nosuch' in namespace 'default'" in res.stderr


def test_master_of_a_job_stopped_before_it_started_does_not_train(env, jobs, tmp_path):
    job = elasticjob("digits")
    job["spec"]["jobDir"] = str(tmp_path / "digits")
    job["metadata"]["annotations"] = {meta.ANNOTATION_STOP: "changed my mind"}
    jobs.create(job)
    res = run(env, "master", "--job", "digits", "--namespace", "default", "--port", "0")
    assert res.returncode == 1
    status = jobs.status("digits")
    assert status["phase"] == "Failed"
    assert status["message"] == "stopped: changed my mind (requested before this master started)"
    assert not (tmp_path / "digits").exists()  # nothing ran


def test_a_master_whose_final_status_is_refused_says_so(k8s_cluster, env, jobs, tmp_path):
    webhook = 'admission webhook "status-guard.example.com" denied the request: status writes are frozen'
    k8s_cluster.admit_patch(lambda res, ns, obj, sub, body: (403, "Forbidden", webhook) if sub == "status" else None)
    job = elasticjob("digits")
    job["spec"]["jobDir"] = str(tmp_path / "digits")
    job["metadata"]["annotations"] = {meta.ANNOTATION_STOP: "changed my mind"}
    jobs.create(job)
    res = run(env, "master", "--job", "digits", "--namespace", "default", "--port", "0")
    told = ('the job ended (Failed: stopped: changed my mind (requested before this master started)), but cannot '
            f'patch the status of ElasticJob "digits": the API server refused it (403 Forbidden): {webhook}')
    assert res.returncode == 2 and told in res.stderr, res.stderr
    (event,) = [e for e in jobs.events("digits") if e["reason"] == "StatusRefused"]
    assert event["type"] == "Warning" and event["message"] == told
