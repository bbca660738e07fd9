"""A script ElasticJob (``spec.script``) end to end on the emulator: operator -> master pod -> worker
pods, each an agent running the user's script with torchrun's environment -> Succeeded, G fixed."""

from __future__ import annotations

import json

import pytest
from ft_helpers import REPO, read_status
from test_elasticjob_e2e import free_port, pods_of, wait_phase

from flextrain.k8s import meta

pytestmark = pytest.mark.e2e

SCRIPT = str(REPO / "examples" / "elastic_script_torch.py")


def test_a_script_elasticjob_runs_its_script_in_every_worker_pod(operator, node_agent, jobs, tmp_path):
    job_dir = tmp_path / "script-job"
    jobs.create({
        "apiVersion": meta.API_VERSION, "kind": meta.KIND,
        "metadata": {"name": "script", "annotations": {meta.ANNOTATION_MASTER_PORT: str(free_port())}},
        "spec": {
            "image": "flextrain:test", "script": SCRIPT,
            "scriptArgs": ["--steps", "12", "--global-batch-size", "48", "--max-micro-batch", "16",
                           "--commit-every", "4"],
            "jobDir": str(job_dir),
            "replicaSpecs": {"worker": {"replicas": 2, "minReplicas": 1, "maxReplicas": 2,
                                        "rendezvousTimeout": 3.0}},
        },
    })
    status = wait_phase(jobs, node_agent, "script", "Succeeded", timeout=240)
    assert status["masterRelaunches"] == 0
    assert {p["metadata"]["name"] for p in pods_of(jobs, "script")} == {
        "script-master-0", "script-worker-0", "script-worker-1"}
    records = [json.loads(line) for line in (job_dir / "script-log.jsonl").read_text().splitlines()]
    starts = [r for r in records if r["event"] == "start"]
    assert sorted(r["rank"] for r in starts) == [0, 1] and {r["world_size"] for r in starts} == {2}
    assert {r["G"] for r in starts} == {48}
    # Two processes, G=48, M=16: 2 accumulation steps of 12 samples each per rank.
    assert {(r["steps"], r["batch_size"]) for r in starts} == {(2, 12)}
    commits = [r["step"] for r in records if r["event"] == "commit"]
    assert commits == [4, 8, 12]
    assert read_status(job_dir)["phase"] == "Succeeded"
