"""The CRD's schema accepts the shipped examples and rejects bad ElasticJobs at the offending field.

kubernetes-validate has no schema for custom resources (asserted below), so
ElasticJobs are validated with jsonschema over the CRD's structural schema;
conftest.elasticjob_validator explains why that is faithful and what it leaves out.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from k8s_static_support import EXAMPLES, load_docs

EXAMPLE_FILES = ("digits-allreduce.yaml", "ctr-ps.yaml", "digits-evaluate.yaml", "digits-predict.yaml")


def example(name: str = "digits-allreduce.yaml") -> dict:
    (job,) = [d for d in load_docs(EXAMPLES / name) if d["kind"] == "ElasticJob"]
    return job


def errors(validator, obj) -> list[str]:
    """Each schema error as 'dotted.path: message'."""
    return sorted(".".join(str(p) for p in e.absolute_path) + ": " + e.message for e in validator.iter_errors(obj))


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_examples_are_valid_elasticjobs(elasticjob_validator, name):
    assert errors(elasticjob_validator, example(name)) == []


def test_ctr_example_uses_parameter_servers_and_deepfm():
    spec = example("ctr-ps.yaml")["spec"]
    assert spec["strategy"] == "ParameterServer"
    assert spec["replicaSpecs"]["ps"]["replicas"] >= 1
    assert spec["modelDef"].endswith("model_zoo/deepfm_torch.py:Model")


def test_kubernetes_validate_has_no_schema_for_custom_resources():
    """Why ElasticJobs are checked against the CRD here instead of by kubernetes-validate."""
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(example(), kubernetes_validate.latest_version(), strict=True)


def _set(obj: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = obj.setdefault(part, {}) if not part.isdigit() else obj[int(part)]
    if value is _DELETE:
        del obj[last]
    else:
        obj[last] = value


_DELETE = object()

# (what is wrong, field to change, bad value, path the error must name)
BAD_SPECS = [
    # "modelDef or script, exactly one" is a CEL rule (no evaluator here): the operator's own check is
    # tested in tests/scriptjobs/test_script_spec.py. So is "data.training unless spec.jobType is evaluation or
    # prediction" (what each job type needs: tests/k8s/operator/test_inference_resource.py).
    ("missing image", "spec.image", _DELETE, "spec"),
    ("empty image", "spec.image", "", "spec.image"),
    ("missing worker replicas", "spec.replicaSpecs.worker.replicas", _DELETE, "spec.replicaSpecs.worker"),
    ("batch size as a string", "spec.training.globalBatchSize", "64", "spec.training.globalBatchSize"),
    ("fractional epochs", "spec.training.epochs", 1.5, "spec.training.epochs"),
    ("zero epochs", "spec.training.epochs", 0, "spec.training.epochs"),
    ("negative replicas", "spec.replicaSpecs.worker.replicas", -2, "spec.replicaSpecs.worker.replicas"),
    ("zero replicas", "spec.replicaSpecs.worker.replicas", 0, "spec.replicaSpecs.worker.replicas"),
    ("negative minReplicas", "spec.replicaSpecs.worker.minReplicas", -1, "spec.replicaSpecs.worker.minReplicas"),
    ("replicas as a string", "spec.replicaSpecs.worker.replicas", "two", "spec.replicaSpecs.worker.replicas"),
    ("negative ps replicas", "spec.replicaSpecs.ps", {"replicas": -1}, "spec.replicaSpecs.ps.replicas"),
    ("unknown strategy", "spec.strategy", "Horovod", "spec.strategy"),
    ("strategy in lower case", "spec.strategy", "allreduce", "spec.strategy"),
    ("unknown lr rule", "spec.training.lrRule", "cosine", "spec.training.lrRule"),
    ("zero learning rate", "spec.training.learningRate", 0, "spec.training.learningRate"),
    ("negative learning rate", "spec.training.learningRate", -0.1, "spec.training.learningRate"),
    ("learning rate as a string", "spec.training.learningRate", "0.1", "spec.training.learningRate"),
    ("shuffle as a string", "spec.training.shuffle", "yes", "spec.training.shuffle"),
    ("negative checkpoint steps", "spec.training.checkpointSteps", -5, "spec.training.checkpointSteps"),
    ("unknown ps mode", "spec.replicaSpecs.ps", {"replicas": 1, "psMode": "eventual"}, "spec.replicaSpecs.ps.psMode"),
    ("misspelt field", "spec.training.globalBatchsize", 64, "spec.training"),
    ("unknown top-level field", "spec.workers", 3, "spec"),
    ("unknown replica type", "spec.replicaSpecs.chief", {"replicas": 1}, "spec.replicaSpecs"),
    ("bad resource quantity", "spec.replicaSpecs.worker.resources.limits.memory", "lots",
     "spec.replicaSpecs.worker.resources.limits.memory"),
    ("env var without a name", "spec.replicaSpecs.worker.env", [{"value": "1"}], "spec.replicaSpecs.worker.env.0"),
    ("env value as a number", "spec.replicaSpecs.worker.env", [{"name": "A", "value": 1}],
     "spec.replicaSpecs.worker.env.0.value"),
    ("volume without mountPath", "spec.volumes", [{"name": "d", "emptyDir": {}}], "spec.volumes.0"),
    ("relative mountPath", "spec.volumes", [{"name": "d", "mountPath": "data", "emptyDir": {}}],
     "spec.volumes.0.mountPath"),
    ("data as a string", "spec.data", "/data/digits", "spec.data"),
    ("micro-batch a word other than auto", "spec.training.maxMicroBatch", "big", "spec.training.maxMicroBatch"),
    ("zero micro-batch", "spec.training.maxMicroBatch", 0, "spec.training.maxMicroBatch"),
    ("negative memory limit", "spec.training.memoryLimit", -1, "spec.training.memoryLimit"),
    ("empty accelerate", "spec.training.accelerate", "", "spec.training.accelerate"),
    ("accelerate as a list", "spec.training.accelerate", ["amp_native"], "spec.training.accelerate"),
    ("unknown status phase", "status", {"phase": "Done"}, "status.phase"),
]


@pytest.mark.parametrize("what, field, value, error_path", BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_is_rejected_at_the_field(elasticjob_validator, what, field, value, error_path):
    job = copy.deepcopy(example())
    _set(job, field, value)
    found = errors(elasticjob_validator, job)
    assert found, f"{what}: accepted"
    assert any(e.split(": ", 1)[0] == error_path for e in found), f"{what}: errors name other fields: {found}"


def test_minimal_job_is_valid(elasticjob_validator):
    """Only image, modelDef, data.training and the worker count are required; the rest has defaults."""
    job = {"apiVersion": "flextrain.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "m"},
           "spec": {"image": "flextrain:0.1.0", "modelDef": "model_zoo/digits_torch.py:Model",
                    "data": {"training": "/data/train"}, "replicaSpecs": {"worker": {"replicas": 1}}}}
    assert errors(elasticjob_validator, job) == []


def test_quantities_accept_integers_and_suffixed_strings(elasticjob_validator):
    job = copy.deepcopy(example())
    job["spec"]["replicaSpecs"]["worker"]["resources"] = {"limits": {"cpu": 2, "memory": "1.5Gi"},
                                                          "requests": {"cpu": "500m", "nvidia.com/gpu": 1}}
    assert errors(elasticjob_validator, job) == []


def test_volume_sources_pass_through(elasticjob_validator):
    """A volume is name + mountPath + any core/v1 volume source; the source is not re-validated by the CRD."""
    job = copy.deepcopy(example())
    job["spec"]["volumes"] = [{"name": "nfs", "mountPath": "/data", "readOnly": True,
                               "nfs": {"server": "nfs.example", "path": "/exports/data"}}]
    assert errors(elasticjob_validator, job) == []


def test_a_status_as_the_master_writes_it_is_valid(elasticjob_validator):
    job = copy.deepcopy(example())
    job["status"] = {
        "phase": "Running", "message": "training", "epoch": 2, "step": 40,
        "workers": {"desired": 3, "active": 2, "summary": "2/3"},
        "selector": "flextrain.dev/job=digits,flextrain.dev/role=worker",
        "progress": {"recordsDone": 1200, "recordsTotal": 11496, "percent": 10.4, "summary": "10.4%"},
        "metrics": {"loss": 0.31, "accuracy": 0.93}, "samplesPerSecond": 812.5, "masterRelaunches": 0,
        "conditions": [{"type": "Running", "status": "True", "reason": "RoundFormed", "message": "2 workers",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "startTime": "2026-01-01T00:00:00Z",
    }
    assert errors(elasticjob_validator, job) == []


def test_status_the_master_writes_fits_the_crd(elasticjob_validator):
    """flextrain.master.k8s_status turns a status.json snapshot into .status; the CRD must keep all of it."""
    from flextrain.master.k8s_status import conditions_for, cr_status

    snapshot = {  # the fields StatusReporter.snapshot() writes to status.json, mid-job
        "name": "digits", "phase": "Running", "message": "", "workers": {"desired": 3, "active": 2},
        "members": [{"id": "w0", "rank": 0, "pid": 10, "round": 1}], "epoch": 2, "epochs": 8, "step": 37,
        "progress": {"recordsDone": 2400, "recordsTotal": 11496, "percent": 20.9},
        "metrics": {"loss": 0.42, "accuracy": 0.9}, "samplesPerSecond": 640.0, "rounds": 2,
        "startTime": "2026-01-01T00:00:00Z", "completionTime": None,
    }
    job = copy.deepcopy(example())
    job["status"] = cr_status(snapshot, job_name="digits")
    job["status"]["conditions"] = conditions_for("Running", "", [])
    assert errors(elasticjob_validator, job) == []
    done = dict(snapshot, phase="Succeeded", message="done", completionTime="2026-01-01T00:10:00Z")
    job["status"] = cr_status(done, job_name="digits")
    job["status"]["conditions"] = conditions_for("Succeeded", "done", conditions_for("Running", "", []))
    assert errors(elasticjob_validator, job) == []


def test_the_adascale_status_fits_the_crd(elasticjob_validator):
    """--lr-rule adascale: the measured gain as lrFactor and the noise scale reach .status; status.json's
    "inf" (μ² estimated as 0) is left out, as the CRD field is a number."""
    from flextrain.master.k8s_status import cr_status

    snapshot = {"name": "digits", "phase": "Running", "workers": {"desired": 2, "active": 2}, "step": 9,
                "progress": {"recordsDone": 576, "recordsTotal": 5632, "percent": 10.2}, "metrics": {},
                "globalBatchSize": 64, "lrRule": "adascale", "lrFactor": 1.61, "learningRate": 0.0805,
                "gradientNoiseScale": 93.512}
    job = copy.deepcopy(example())
    job["status"] = cr_status(snapshot, job_name="digits")
    assert (job["status"]["lrFactor"], job["status"]["gradientNoiseScale"]) == (1.61, 93.512)
    assert errors(elasticjob_validator, job) == []
    job["status"] = cr_status(dict(snapshot, gradientNoiseScale="inf"), job_name="digits")
    assert "gradientNoiseScale" not in job["status"] and errors(elasticjob_validator, job) == []


def test_auto_micro_batch_and_its_limit_fit_the_crd(elasticjob_validator):
    """maxMicroBatch takes an integer or "auto", memoryLimit bytes or a size; status.maxMicroBatch is the
    M the master chose."""
    from flextrain.master.k8s_status import cr_status

    job = copy.deepcopy(example())
    for limit in ("2GiB", 2**31):
        job["spec"]["training"].update(maxMicroBatch="auto", memoryLimit=limit)
        assert errors(elasticjob_validator, job) == []
    job["status"] = cr_status({"phase": "Running", "maxMicroBatch": 24, "maxMicroBatchChoice": {"setting": "auto"}},
                              job_name="digits")
    assert job["status"]["maxMicroBatch"] == 24 and errors(elasticjob_validator, job) == []


def test_accelerate_and_the_strategy_status_fit_the_crd(elasticjob_validator):
    """training.accelerate takes auto, a method list or inline JSON; status.accelerate is the strategy applied."""
    from flextrain.master.k8s_status import cr_status

    job = copy.deepcopy(example())
    for value in ("auto", "amp_native:bf16,checkpoint:Block", '{"format": "flextrain.accelerate.strategy/1", '
                                                              '"methods": [{"name": "half", "config": "bf16"}]}'):
        job["spec"]["training"]["accelerate"] = value
        assert errors(elasticjob_validator, job) == []
    job["status"] = cr_status({"phase": "Running", "accelerate": {"setting": "auto", "strategy": "amp_native:bf16"}},
                              job_name="digits")
    assert job["status"]["accelerate"] == "amp_native:bf16" and errors(elasticjob_validator, job) == []
    unchosen = cr_status({"phase": "Running", "accelerate": {"setting": "auto", "strategy": None}}, job_name="digits")
    assert "accelerate" not in unchosen
