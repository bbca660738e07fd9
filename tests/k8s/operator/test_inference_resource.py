"""Evaluation and prediction ElasticJobs (spec.jobType): the JobSpec round trip, what each type needs (refused by
the operator naming every missing field), ``flextrain evaluate|predict --backend kubernetes`` and their results
in the CR status. Running them end to end: tests/k8s/e2e/test_inference_jobs_e2e.py."""

from __future__ import annotations

import pytest
import yaml
from ft_helpers import wait_for

from flextrain.job import Backend, JobSpec, JobType, Strategy
from flextrain.k8s import meta
from flextrain.k8s.resource import jobspec_from_resource, problems, resource_from_jobspec
from flextrain.master.k8s_status import cr_status

EVALUATE = ("evaluate", "--backend", "kubernetes", "--model-def", "/opt/zoo/digits_torch.py:Model",
            "--checkpoint", "/data/jobs/digits", "--validation-data", "/data/digits/validation",
            "--workers", "2", "--job-name", "digits-eval", "--image", "flextrain:test")
PREDICT = ("predict", "--backend", "kubernetes", "--model-def", "/opt/zoo/digits_torch.py:Model",
           "--checkpoint", "/data/jobs/digits/checkpoints/final.ckpt", "--prediction-data", "/data/digits/validation",
           "--output", "/data/predictions", "--job-name", "digits-predict", "--image", "flextrain:test")


def elasticjob(job_type: str, **spec) -> dict:
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": f"digits-{job_type[:4]}"},
            "spec": {"image": "flextrain:test", "modelDef": "/zoo/digits_torch.py:Model", "jobType": job_type,
                     "replicaSpecs": {"worker": {"replicas": 2}}, **spec}}


@pytest.mark.parametrize("job_type, fields", [
    (JobType.EVALUATION, {"validation_data": "/data/validation"}),
    (JobType.PREDICTION, {"prediction_data": "/data/validation", "output": "/data/predictions"}),
])
def test_an_inference_jobspec_round_trips_through_its_elasticjob(job_type, fields):
    spec = JobSpec.of(name="digits-x", model_def="/zoo/digits_torch.py:Model", job_dir="/jobs/digits-x",
                      backend=Backend.KUBERNETES, job_type=job_type, checkpoint="/jobs/digits", workers=3,
                      steps_per_task=2, **fields).validate()
    body = resource_from_jobspec(spec, image="flextrain:test")
    assert body["spec"]["jobType"] == job_type.value and body["spec"]["checkpoint"] == "/jobs/digits"
    assert "epochs" not in body["spec"]["training"]  # read once: the training default is left out
    assert yaml.safe_load(yaml.safe_dump(body)) == body  # plain YAML: the enum went out as its value
    assert jobspec_from_resource(body) == spec


def test_each_job_type_is_refused_naming_every_field_it_lacks():
    assert problems(elasticjob("evaluation")) == [
        "spec.checkpoint: is required for jobType evaluation (the checkpoint file, or a training job's jobDir, "
        "in the pods)",
        "spec.data.validation: is required for jobType evaluation (the records to evaluate on)"]
    found = problems(elasticjob("prediction", checkpoint="/jobs/digits"))
    assert [p.split(":")[0] for p in found] == ["spec.data.prediction", "spec.output"]
    assert problems(elasticjob("training")) == ["spec.data.training: is required"]
    assert problems(elasticjob("inference", data={"training": "/d"})) == [
        "spec.jobType: must be training | evaluation | prediction, got 'inference'"]  # nothing judged as training
    ps = elasticjob("evaluation", checkpoint="/c", data={"validation": "/v"}, strategy="ParameterServer",
                    replicaSpecs={"worker": {"replicas": 1}, "ps": {"replicas": 1}})
    assert problems(ps) == ["evaluation jobs run without spec.strategy (got ParameterServer)"]
    ok = elasticjob("evaluation", checkpoint="/c", data={"validation": "/v"})
    assert problems(ok) == [] and jobspec_from_resource(ok).strategy is Strategy.ALLREDUCE


def test_the_operator_refuses_an_evaluation_job_without_a_checkpoint(operator, jobs):
    jobs.create(elasticjob("evaluation", data={"validation": "/data/validation"}))
    status = wait_for(lambda: jobs.status("digits-eval").get("phase") == "Failed" and jobs.status("digits-eval"),
                      timeout=30, what="the job to fail")
    assert status["message"].startswith("spec.checkpoint: is required for jobType evaluation")
    assert "InvalidSpec" in jobs.reasons("digits-eval")
    assert jobs.master_pods("digits-eval") == {}  # nothing was started


def test_evaluate_and_predict_submit_elasticjobs_with_paths_in_the_pods(cli, jobs):
    res = cli(*EVALUATE, "--pvc", "flextrain-data:/data", "--dry-run")
    assert res.returncode == 0, res.stderr
    body = yaml.safe_load(res.stdout)
    assert body["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "flextrain-data"}
    spec = jobspec_from_resource(body)
    assert (spec.job_type, spec.checkpoint, spec.data.validation, spec.worker.replicas) == (
        JobType.EVALUATION, "/data/jobs/digits", "/data/digits/validation", 2)  # a job directory: found in the pod
    assert spec.job_dir == "/flextrain-jobs/digits-eval" and jobs.get("digits-eval") is None

    res = cli(*PREDICT)
    assert res.returncode == 0, res.stderr
    assert "elasticjob.flextrain.dev/digits-predict created in namespace default" in res.stdout
    spec = jobspec_from_resource(jobs.get("digits-predict"))
    assert (spec.job_type, spec.checkpoint, spec.data.prediction, spec.output) == (
        JobType.PREDICTION, "/data/jobs/digits/checkpoints/final.ckpt", "/data/digits/validation", "/data/predictions")

    local_only = cli(*EVALUATE, "--overwrite")
    assert local_only.returncode == 2 and "--overwrite is for local jobs" in local_only.stderr
    no_backend = cli(*[a for a in PREDICT if a not in ("--backend", "kubernetes")], "--dry-run")
    assert no_backend.returncode == 2 and "--dry-run needs --backend kubernetes" in no_backend.stderr


def test_status_of_an_inference_job_carries_its_result(cli, jobs):
    evaluation = {"step": 42, "metrics": {"accuracy": 0.75, "auc": "nan"}, "samples": 359, "time": 1.0}
    snap = {"phase": "Succeeded", "metrics": {"accuracy": 0.75, "auc": "nan"}, "evaluations": [evaluation]}
    assert cr_status(snap, job_name="e")["evaluation"] == {"step": 42, "samples": 359,
                                                           "metrics": {"accuracy": 0.75, "auc": "nan"}}
    running = cr_status({"phase": "Running", "prediction": {"output": "/out", "records": None}}, job_name="p")
    assert running["prediction"] == {"output": "/out"} and "evaluation" not in running
    assert "prediction" not in cr_status({"phase": "Running"}, job_name="t")

    assert cli(*PREDICT).returncode == 0
    job = jobs.get("digits-predict")
    jobs.kube.patch_status(job, cr_status({"phase": "Succeeded", "message": "359 predictions written to /data/p",
                                           "prediction": {"output": "/data/p", "records": 359}},
                                          job_name="digits-predict"))
    res = cli("status", "digits-predict", "--backend", "kubernetes")
    assert res.returncode == 0, res.stderr
    assert "output    359 predictions in /data/p" in res.stdout
