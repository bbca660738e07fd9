"""Evaluation and prediction ElasticJobs end to end: the shipped examples, run by operator, master pod and
worker pods on the emulated cluster, against a digits checkpoint whose answers are computed here.

The examples (manifests/examples/digits-evaluate.yaml, digits-predict.yaml) name paths inside the pods
(``/data`` on a volume, the model zoo at ``/opt/flextrain``); every "pod" here is a local process, so those
paths are mapped onto this test's directory and the repository, and the volumes left out.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml
from ft_helpers import wait_for

from flextrain.data import read_records
from flextrain.data.predictions import read_predictions
from flextrain.elastic.statecodec import encode
from flextrain.k8s import meta
from test_elasticjob_e2e import free_port, pods_of, run_cli, wait_phase

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "manifests" / "examples"
VALIDATION_RECORDS = 359  # digits validation records


def example(name: str, root: Path) -> dict:
    """The example ElasticJob with its in-pod paths mapped to ``root`` (for /data) and the repository."""
    (job,) = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d and d["kind"] == "ElasticJob"]
    job = copy.deepcopy(job)

    def local(value):
        if isinstance(value, dict):
            return {k: local(v) for k, v in value.items()}
        if isinstance(value, str) and value.startswith("/data/"):
            return str(root / value.removeprefix("/"))
        if isinstance(value, str) and value.startswith("/opt/flextrain/"):
            return str(REPO / value.removeprefix("/opt/flextrain/"))
        return value

    spec = local({k: v for k, v in job["spec"].items() if k != "volumes"})
    job["spec"] = spec
    job["metadata"]["annotations"] = {meta.ANNOTATION_MASTER_PORT: str(free_port())}
    return job


def digits_model(zoo: dict):
    import importlib.util

    module_spec = importlib.util.spec_from_file_location("digits_for_inference", REPO / "model_zoo" / "digits_torch.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    zoo["module"] = module
    torch.manual_seed(11)
    return module.Model()


def test_evaluation_and_prediction_elasticjobs_report_their_results(operator, node_agent, jobs, digits_data,
                                                                    tmp_path, k8s_cluster):
    root = tmp_path / "volume"
    (root / "data").mkdir(parents=True)
    (root / "data" / "digits").symlink_to(digits_data)
    # The digits-allreduce example's job directory, as a finished training job leaves it.
    zoo: dict = {}
    model = digits_model(zoo)
    final = root / "data" / "jobs" / "digits" / "checkpoints" / "final.ckpt"
    final.parent.mkdir(parents=True)
    final.write_bytes(encode({"model": model.state_dict(), "optimizer": {}, "version": 42}))

    evaluate, predict = example("digits-evaluate.yaml", root), example("digits-predict.yaml", root)
    jobs.create(evaluate)
    jobs.create(predict)  # both at once: two masters, four workers
    # A checkpoint the master pod cannot find fails the job before any worker pod starts, naming the field.
    missing = example("digits-evaluate.yaml", root)
    missing["metadata"]["name"], missing["spec"]["checkpoint"] = "no-checkpoint", str(root / "data" / "jobs" / "nope")
    missing["spec"]["jobDir"] = str(root / "data" / "jobs" / "no-checkpoint")
    jobs.create(missing)

    sources = sorted((root / "data" / "digits" / "validation").glob("*.rio"))  # as the pods name them
    records = [(str(s), i, r) for s in sources for i, r in enumerate(read_records(s))]
    assert len(records) == VALIDATION_RECORDS
    model.eval()
    with torch.no_grad():
        features, labels = zoo["module"].feed([r for _, _, r in records], "evaluation", None)
        expected = model(features)
    accuracy = (expected.argmax(dim=1) == labels).float().mean().item()

    status = wait_phase(jobs, node_agent, "digits-evaluate", "Succeeded", timeout=300)
    assert status["metrics"]["accuracy"] == pytest.approx(accuracy, abs=1e-6)  # the local evaluation's
    assert status["evaluation"]["step"] == 42 and status["evaluation"]["samples"] == VALIDATION_RECORDS
    assert status["evaluation"]["metrics"] == status["metrics"]
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == VALIDATION_RECORDS
    assert "prediction" not in status

    status = wait_phase(jobs, node_agent, "digits-predict", "Succeeded", timeout=300)
    output = Path(predict["spec"]["output"])
    assert status["prediction"] == {"output": str(output), "records": VALIDATION_RECORDS}
    rows = read_predictions(output)
    assert [(r["source"], r["index"]) for r in rows] == [(s, i) for s, i, _ in records]  # one each, in order
    torch.testing.assert_close(torch.tensor([r["prediction"] for r in rows]), expected, rtol=1e-5, atol=1e-5)

    # Both ran as ElasticJobs do: a master pod, worker pods, the phase events; the master resolved the
    # checkpoint of the training job's directory. (The pods that ran, not those left: a worker pod still
    # alive when its master closes is deleted.)
    for name in ("digits-evaluate", "digits-predict"):
        assert {p for p in node_agent.started_pods if p.startswith(f"{name}-")} == {
            f"{name}-master-0", f"{name}-worker-0", f"{name}-worker-1"}
        wait_for(lambda: "JobSucceeded" in jobs.reasons(name), timeout=30, what=f"{name}'s JobSucceeded event")
    status = wait_phase(jobs, node_agent, "no-checkpoint", "Failed", timeout=120)
    assert status["message"] == f"the master cannot start: spec.checkpoint {root}/data/jobs/nope: no such file or directory"
    assert pods_of(jobs, "no-checkpoint", "worker") == []
    spec = json.loads((Path(evaluate["spec"]["jobDir"]) / "jobspec.json").read_text())
    assert spec["checkpoint"] == str(final) and spec["job_type"] == "evaluation"

    shown = run_cli(k8s_cluster, jobs, "status", "digits-predict")
    assert f"output    {VALIDATION_RECORDS} predictions in {output}" in shown
    assert "accuracy" in run_cli(k8s_cluster, jobs, "status", "digits-evaluate")


def test_an_evaluation_job_is_elastic_a_deleted_worker_pod_and_a_scale_up_mid_evaluation(
        operator, node_agent, jobs, tmp_path):
    """The stepcount model's metrics are known exactly (tests/evaluation/zoo/stepcount.py): whatever pods come
    and go, every validation record is evaluated once."""
    from evaluation.evalcases import STEPCOUNT, stepcount_checkpoint, write_csv

    write_csv(tmp_path / "validation" / "a.csv", range(0, 60))
    write_csv(tmp_path / "validation" / "b.csv", range(60, 100))
    gate = tmp_path / "gate"
    job = {
        "apiVersion": meta.API_VERSION, "kind": meta.KIND,
        "metadata": {"name": "steps", "annotations": {meta.ANNOTATION_MASTER_PORT: str(free_port())}},
        "spec": {
            "image": "flextrain:test", "jobType": "evaluation", "modelDef": STEPCOUNT,
            "checkpoint": str(stepcount_checkpoint(tmp_path / "model.ckpt", version=7)),
            "jobDir": str(tmp_path / "steps"), "data": {"validation": str(tmp_path / "validation")},
            "training": {"globalBatchSize": 10, "stepsPerTask": 2, "maxMicroBatch": 4},
            "replicaSpecs": {"worker": {"replicas": 2, "minReplicas": 1, "maxReplicas": 3,
                                        "env": [{"name": "STEPCOUNT_EVAL_GATE", "value": str(gate)}]}},
        },
    }
    jobs.create(job)
    wait_for(lambda: len(list(tmp_path.glob("gate.*"))) >= 2, timeout=120, what="both workers evaluating")
    jobs.kube.core.delete_namespaced_pod("steps-worker-0", jobs.namespace, grace_period_seconds=0)
    jobs.patch("steps", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
    wait_for(lambda: len({p["metadata"]["name"] for p in pods_of(jobs, "steps", "worker")} - {"steps-worker-0"}) >= 3,
             timeout=120, what="a replacement for the deleted worker and a third worker")
    gate.with_suffix(".release").touch()

    status = wait_phase(jobs, node_agent, "steps", "Succeeded", timeout=240)
    assert status["metrics"] == {"step": 7.0, "x": 49.5, "accuracy": 0.8}  # every record once
    assert status["evaluation"] == {"step": 7, "samples": 100, "metrics": status["metrics"]}
