"""`flextrain train --backend kubernetes` / status / scale / stop against the emulated API server.

The real CLI runs in a child process with KUBECONFIG pointing at the emulator.
"""

from __future__ import annotations

import json
import os
import subprocess

import yaml
from ft_helpers import flextrain_cmd

from flextrain.k8s import meta
from flextrain.k8s.resource import jobspec_from_resource

TRAIN = ("train", "--backend", "kubernetes", "--model-def", "/opt/zoo/digits_torch.py:Model",
         "--training-data", "/data/digits/train", "--workers", "2", "--min-workers", "1", "--max-workers", "3",
         "--epochs", "2", "--job-name", "digits", "--image", "flextrain:test")


def test_dry_run_prints_the_elasticjob_and_submits_nothing(cli, jobs):
    res = cli(*TRAIN, "--dry-run", "--pvc", "flextrain-data:/data", "--namespace", "team-a")
    assert res.returncode == 0, res.stderr
    body = yaml.safe_load(res.stdout)
    assert body["metadata"] == {"name": "digits", "namespace": "team-a"}
    assert body["spec"]["volumes"] == [{"name": "pvc-0", "mountPath": "/data",
                                        "persistentVolumeClaim": {"claimName": "flextrain-data"}}]
    spec = jobspec_from_resource(body)
    assert (spec.worker.replicas, spec.worker.min_replicas, spec.worker.max_replicas, spec.training.epochs) == (2, 1, 3, 2)
    assert spec.model_def == "/opt/zoo/digits_torch.py:Model"  # an in-pod path, not resolved here
    assert jobs.get("digits") is None


def test_a_database_job_carries_its_secret_and_never_its_password(cli, jobs):
    table = ("--training-data", "postgresql+psycopg://ml@db.team-a:5432/ml?table=train&key=id")
    args = [a for a in TRAIN]
    args[args.index("--training-data") + 1] = table[1]
    res = cli(*args, "--data-secret", "db-credentials", "--dry-run")
    assert res.returncode == 0, res.stderr
    body = yaml.safe_load(res.stdout)
    assert body["spec"]["data"] == {"training": table[1], "secretRef": "db-credentials"}
    args[args.index("--training-data") + 1] = table[1].replace("ml@", "ml:hunter2@")
    res = cli(*args, "--data-secret", "db-credentials", "--dry-run")
    assert res.returncode == 2 and "--training-data: a database URL must not hold its password" in res.stderr
    assert "hunter2" not in res.stderr + res.stdout


def test_submit_status_scale_stop(cli, jobs):
    res = cli(*TRAIN)
    assert res.returncode == 0, res.stderr
    assert "elasticjob.flextrain.dev/digits created in namespace default" in res.stdout
    job = jobs.get("digits")
    assert jobspec_from_resource(job).worker.replicas == 2

    again = cli(*TRAIN)
    assert again.returncode == 2 and "ElasticJob 'digits' already exists in namespace 'default'" in again.stderr

    jobs.kube.patch_status(job, {"phase": "Running", "message": "training",
                                 "workers": {"desired": 2, "active": 2},
                                 "progress": {"recordsDone": 50, "recordsTotal": 200, "percent": 25.0}})
    res = cli("status", "digits", "--backend", "kubernetes")
    assert res.returncode == 0, res.stderr
    assert "phase     Running  - training" in res.stdout and "2 active / 2 desired" in res.stdout
    assert "50/200 records (25.0%)" in res.stdout
    res = cli("status", "digits", "--namespace", "default", "--json")
    assert json.loads(res.stdout)["progress"]["percent"] == 25.0

    res = cli("scale", "digits", "5", "--namespace", "default")
    assert res.returncode == 2
    assert ("spec.replicaSpecs.worker.maxReplicas (3) < replicas (5); allowed: "
            "spec.replicaSpecs.worker.minReplicas..maxReplicas = 1..3") in res.stderr  # as ScaleRejected says it
    assert jobs.get("digits")["spec"]["replicaSpecs"]["worker"]["replicas"] == 2

    res = cli("scale", "digits", "3", "--namespace", "default")
    assert res.returncode == 0, res.stderr
    assert jobs.get("digits")["spec"]["replicaSpecs"]["worker"]["replicas"] == 3

    res = cli("stop", "digits", "--namespace", "default", "--reason", "enough")
    assert res.returncode == 0, res.stderr
    assert jobs.get("digits")["metadata"]["annotations"][meta.ANNOTATION_STOP] == "enough"


def test_status_of_a_failed_job_prints_its_root_cause_and_non_finite_metrics(cli, jobs):
    assert cli(*TRAIN).returncode == 0
    failure = {"worker": "worker-1", "kind": "UserCode", "exitCode": 3, "exception": "RuntimeError",
               "message": "no vocab", "location": "/opt/zoo/m.py:12 in __init__", "stage": "starting",
               "log": "kubectl logs -n default digits-worker-1"}
    jobs.kube.patch_status(jobs.get("digits"), {"phase": "Failed", "message": "worker-1 failed: RuntimeError",
                                                "metrics": {"loss": "nan", "accuracy": 0.5}, "failure": failure})
    res = cli("status", "digits", "--backend", "kubernetes")
    assert res.returncode == 0, res.stderr
    assert "loss      nan" in res.stdout and "accuracy  0.5000" in res.stdout
    assert "root cause: worker-1 (UserCode, exit code 3)" in res.stdout
    assert "at: /opt/zoo/m.py:12 in __init__" in res.stdout and "log: kubectl logs -n default digits-worker-1" in res.stdout


def test_commands_on_missing_or_finished_jobs_name_the_problem(cli, jobs):
    res = cli("status", "nosuch", "--namespace", "default")
    assert res.returncode == 2 and "no ElasticJob 'nosuch' in namespace 'default'" in res.stderr
    assert cli(*TRAIN).returncode == 0
    jobs.kube.patch_status(jobs.get("digits"), {"phase": "Succeeded"})
    res = cli("scale", "digits", "3", "--namespace", "default")
    assert res.returncode == 2 and "job digits is not running (phase Succeeded)" in res.stderr
    res = cli("stop", "digits", "--namespace", "default")
    assert res.returncode == 2 and "not running" in res.stderr


def test_kubernetes_flags_need_the_kubernetes_backend(cli):
    res = cli("train", "--model-def", "x.py:M", "--training-data", "d", "--namespace", "ns")
    assert res.returncode == 2 and "--namespace needs --backend kubernetes" in res.stderr
    res = cli(*TRAIN, "--pvc", "no-mount-path")
    assert res.returncode == 2 and "--pvc 'no-mount-path': expected CLAIM:/mount/path" in res.stderr
    res = cli(*TRAIN[:-2], "--workers", "0", "--dry-run")
    assert res.returncode == 2 and "--workers must be a positive integer" in res.stderr


def test_status_watch_follows_the_elasticjob_until_it_ends(cli, jobs, k8s_cluster):
    assert cli(*TRAIN).returncode == 0
    jobs.kube.patch_status(jobs.get("digits"), {"phase": "Running", "message": "training",
                                                "workers": {"desired": 2, "active": 2}})
    env = {**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)}
    env.pop(meta.ENV_NAMESPACE, None)
    watch = subprocess.Popen(flextrain_cmd("status", "digits", "--backend", "kubernetes", "--watch"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        jobs.kube.patch_status(jobs.get("digits"), {"phase": "Succeeded", "message": "training finished"})
        out, err = watch.communicate(timeout=120)  # it ends by itself once the job has
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert "phase     Succeeded  - training finished" in out and "ElasticJob in default" in out
