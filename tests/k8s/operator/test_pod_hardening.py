"""What the user writes wins over flextrain's least-privilege defaults (flextrain/k8s/hardening.py), and
flextrain's own volume names are refused at admission."""

from __future__ import annotations

import copy

from flextrain.k8s import meta
from flextrain.k8s.master_pod import master_pod
from flextrain.k8s.pods import instance_pod
from flextrain.k8s.resource import problems

JOB = {
    "apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": "digits", "namespace": "ns", "uid": "u"},
    "spec": {"image": "flextrain:1", "modelDef": "/zoo/m.py:Model", "data": {"training": "/data/train"},
             "jobDir": "/data/jobs/digits",
             "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}, "mountPath": "/data"}],
             "replicaSpecs": {"worker": {"replicas": 2, "env": [{"name": "HOME", "value": "/data/home"}]}}},
}


def worker(job: dict) -> dict:
    return instance_pod(job, role="worker", index=0, instance_id="worker-0", args=["worker"], env={},
                        master_address="m:1")


def test_a_job_dir_on_a_volume_gets_no_empty_dir_and_the_users_env_stays():
    pod = worker(JOB)
    (container,) = pod["spec"]["containers"]
    # /data holds the job dir (flextrain-tls: spec.tls's Secret, flextrain/k8s/tls_secret.py)
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "flextrain-scratch", "flextrain-tls"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOME"] == "/data/home" and [e["name"] for e in container["env"]].count("HOME") == 1
    assert env["TMPDIR"] == "/tmp" and env["TORCH_HOME"] == "/tmp/home/.cache/torch"
    # the master: the same volumes, but its user env is its own (no HOME given)
    master_env = {e["name"]: e.get("value") for e in master_pod(JOB, index=0)["spec"]["containers"][0]["env"]}
    assert master_env["HOME"] == "/tmp/home"


def test_a_template_turns_read_only_root_and_the_missing_token_off_and_its_tmp_mount_replaces_ours():
    job = copy.deepcopy(JOB)
    job["spec"]["replicaSpecs"]["worker"]["template"] = {"spec": {
        "automountServiceAccountToken": True, "serviceAccountName": "reader",
        "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
        "containers": [{"securityContext": {"readOnlyRootFilesystem": False},
                        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}]}]}}
    assert problems(job) == []
    pod = worker(job)
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is False
    assert pod["spec"]["automountServiceAccountToken"] is True and pod["spec"]["serviceAccountName"] == "reader"
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "scratch", "flextrain-tls"]
    assert {"name": "TMPDIR", "value": "/tmp"} in container["env"]  # the user's /tmp serves as the scratch


def test_flextrains_volume_names_are_refused_naming_where():
    job = copy.deepcopy(JOB)
    job["spec"]["volumes"].append({"name": "flextrain-scratch", "emptyDir": {}, "mountPath": "/scratch"})
    job["spec"]["replicaSpecs"]["ps"] = {"template": {"spec": {"volumes": [{"name": "flextrain-job-dir",
                                                                            "emptyDir": {}}]}}}
    found = [p for p in problems(job) if "flextrain adds to every pod" in p]
    assert [p.split(":")[0] for p in found] == ["spec.volumes[1].name",
                                                "spec.replicaSpecs.ps.template.spec.volumes[0].name"]
