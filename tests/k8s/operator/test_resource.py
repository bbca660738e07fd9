"""ElasticJob <-> JobSpec: valid specs round-trip; every bad spec names its CRD field path."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from flextrain.job import Backend, JobSpec, Strategy
from flextrain.k8s import meta
from flextrain.k8s.pods import pod_settings
from flextrain.k8s.resource import (
    DEFAULT_JOBS_ROOT,
    ResourceError,
    jobspec_from_resource,
    master_relaunch_budget,
    path_of,
    problems,
    resource_from_jobspec,
)

REPO = Path(__file__).resolve().parents[3]


def job(**spec_changes) -> dict:
    spec = {
        "image": "flextrain:test",
        "modelDef": "/opt/zoo/digits_torch.py:Model",
        "data": {"training": "/data/train", "validation": "/data/validation"},
        "training": {"epochs": 2, "globalBatchSize": 64, "maxMicroBatch": 32, "learningRate": 0.1},
        "replicaSpecs": {"worker": {"replicas": 2, "minReplicas": 1, "maxReplicas": 4}},
    }
    for dotted, value in spec_changes.items():
        node = spec
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND,
            "metadata": {"name": "digits", "namespace": "default"}, "spec": spec}


def error_of(obj) -> ResourceError:
    with pytest.raises(ResourceError) as info:
        jobspec_from_resource(obj)
    return info.value


def test_valid_spec_maps_every_field():
    spec = jobspec_from_resource(job(training__checkpointSteps=50, training__shuffle=True,
                                     replicaSpecs__worker__relaunchBudget=5,
                                     replicaSpecs__worker__workerTimeout=30))
    assert spec.name == "digits" and spec.backend is Backend.KUBERNETES
    assert (spec.worker.replicas, spec.worker.min_replicas, spec.worker.max_replicas) == (2, 1, 4)
    assert (spec.training.epochs, spec.training.global_batch_size, spec.training.max_micro_batch) == (2, 64, 32)
    assert spec.training.learning_rate == 0.1 and spec.training.checkpoint_steps == 50 and spec.training.shuffle is True
    assert spec.worker.relaunch_budget == 5 and spec.worker.worker_timeout == 30.0
    assert spec.data.validation == "/data/validation"
    assert spec.job_dir == f"{DEFAULT_JOBS_ROOT}/digits"  # a relaunched master finds its ledger here


@pytest.mark.parametrize("example", sorted((REPO / "manifests" / "examples").glob("*.yaml")))
def test_shipped_examples_are_valid(example):
    jobs = [d for d in yaml.safe_load_all(example.read_text()) if d and d.get("kind") == meta.KIND]
    for obj in jobs:
        spec = jobspec_from_resource(obj)
        assert spec.name == obj["metadata"]["name"]


def test_round_trip_through_the_resource():
    spec = JobSpec.of(name="ctr", model_def="/zoo/deepfm.py:Model", training_data="/d/train",
                   validation_data="/d/val", job_dir="/vol/jobs/ctr", strategy=Strategy.PARAMETER_SERVER,
                   ps=2, ps_mode="async", workers=3, min_workers=2, max_workers=5, epochs=3,
                   global_batch_size=256, learning_rate=0.01, shuffle=True, checkpoint_steps=10,
                   backend=Backend.KUBERNETES).validate()
    obj = resource_from_jobspec(spec, image="img:1", namespace="team-a")
    assert obj["metadata"] == {"name": "ctr", "namespace": "team-a"}
    assert obj["spec"]["replicaSpecs"]["ps"] == {"replicas": 2, "psMode": "async"}
    assert obj["spec"]["strategy"] == "ParameterServer"
    assert jobspec_from_resource(yaml.safe_load(yaml.safe_dump(obj))) == spec


def test_pod_fields_are_carried_and_split():
    volumes = [{"name": "data", "mountPath": "/data", "readOnly": True,
                "persistentVolumeClaim": {"claimName": "flextrain-data"}}]
    obj = job(volumes=volumes, replicaSpecs__worker__priorityClassName="low",
              replicaSpecs__worker__env=[{"name": "OMP_NUM_THREADS", "value": "1"}])
    jobspec_from_resource(obj)
    worker = pod_settings(obj, "worker")
    assert worker.volumes == ({"name": "data", "persistentVolumeClaim": {"claimName": "flextrain-data"}},)
    assert worker.volume_mounts == ({"name": "data", "mountPath": "/data", "readOnly": True},)
    assert worker.priority_class_name == "low" and worker.env[0]["name"] == "OMP_NUM_THREADS"
    assert pod_settings(obj, "master").priority_class_name is None


@pytest.mark.parametrize("changes, path, words", [
    ({"replicaSpecs__worker__minReplicas": 5, "replicaSpecs__worker__replicas": 3},
     "spec.replicaSpecs.worker.minReplicas", "(5) > replicas (3)"),
    ({"replicaSpecs__worker__maxReplicas": 2, "replicaSpecs__worker__replicas": 3},
     "spec.replicaSpecs.worker.maxReplicas", "(2) < replicas (3)"),
    ({"replicaSpecs__worker__replicas": 0}, "spec.replicaSpecs.worker.replicas", "must be a positive integer"),
    ({"replicaSpecs__worker__replicas": "two"}, "spec.replicaSpecs.worker.replicas", "must be an integer"),
    ({"training__epochs": 0}, "spec.training.epochs", "positive integer"),
    ({"training__globalBatchSize": True}, "spec.training.globalBatchSize", "must be an integer"),
    ({"training__learningRate": -1}, "spec.training.learningRate", "must be positive"),
    ({"training__checkpointSteps": -2}, "spec.training.checkpointSteps", ">= 0"),
    ({"training__epoch": 3}, "spec.training.epoch", "unknown field"),
    ({"strategy": "Horovod"}, "spec.strategy", "AllReduce | ParameterServer"),
    ({"strategy": "ParameterServer"}, "spec.strategy", "needs spec.replicaSpecs.ps.replicas"),
    ({"replicaSpecs__ps__replicas": 2}, "spec.replicaSpecs.ps.replicas", "needs spec.strategy"),
    ({"replicaSpecs__ps__psMode": "eventually"}, "spec.replicaSpecs.ps.psMode", "'sync' or 'async'"),
    ({"modelDef": ...}, "spec.modelDef", "is required"),
    ({"image": ""}, "spec.image", "is required"),
    ({"data__training": ...}, "spec.data.training", "is required"),
    ({"replicaSpecs__master__relaunchBudget": -1}, "spec.replicaSpecs.master.relaunchBudget", ">= 0"),
    ({"volumes": [{"name": "data"}]}, "spec.volumes[0].mountPath", "is required"),
    ({"training__checkpointDir": "/elsewhere"}, "spec.training.checkpointDir", "not supported yet"),
    ({"data__training": "postgresql+psycopg://ml:hunter2@db/ml?table=train"}, "spec.data.training",
     "must not hold its password"),
])
def test_bad_spec_names_the_field(changes, path, words):
    err = error_of(job(**changes))
    assert err.path == path
    assert str(err).startswith(path) and words in str(err), str(err)


def test_bad_name_names_metadata():
    obj = job()
    obj["metadata"]["name"] = "Digits_Job"
    err = error_of(obj)
    assert err.path == "metadata.name" and "DNS label" in str(err)


def test_wrong_kind_is_rejected():
    obj = job()
    obj["kind"] = "TFJob"
    assert "expected flextrain.dev/v1alpha1 ElasticJob" in str(error_of(obj))


def test_checkpoint_dir_inside_the_job_dir_is_accepted():
    spec = jobspec_from_resource(job(jobDir="/vol/j", training__checkpointDir="/vol/j/checkpoints/"))
    assert spec.job_dir == "/vol/j"


def test_relaunch_budget_default_and_override():
    older = "spec.replicaSpecs.master.relaunchBudget"
    assert master_relaunch_budget(job()) == (3, older)
    assert master_relaunch_budget(job(replicaSpecs__master__relaunchBudget=0)) == (0, older)
    # Kubernetes' name wins over the older one (which the CRD defaults, so both are usually there)
    assert master_relaunch_budget(job(backoffLimit=1, replicaSpecs__master__relaunchBudget=3)) == (
        1, "spec.backoffLimit")


def test_shared_cluster_fields_map_to_the_jobspec_and_back():
    obj = job(suspend=True, ttlSecondsAfterFinished=0, activeDeadlineSeconds=60, backoffLimit=2,
              scheduling={"gang": "kueue", "queue": "team-a"},
              replicaSpecs__worker__priorityClassName="core", replicaSpecs__worker__elasticPriorityClassName="spot")
    spec = jobspec_from_resource(obj)
    assert (spec.suspend, spec.ttl_seconds_after_finished, spec.active_deadline_seconds, spec.backoff_limit) == (
        True, 0, 60, 2)
    assert (spec.scheduling.gang, spec.scheduling.queue) == ("kueue", "team-a")
    assert (spec.worker.priority_class_name, spec.worker.elastic_priority_class_name) == ("core", "spot")
    back = resource_from_jobspec(spec, image="flextrain:test")
    assert back["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}  # what Kueue selects by
    assert jobspec_from_resource(back) == spec


def test_bad_shared_cluster_fields_name_the_field():
    found = problems(job(scheduling={"gang": "slurm"}, activeDeadlineSeconds=0,
                         replicaSpecs__worker__elasticPriorityClassName="Not_A_Name"))
    text = "\n".join(found)
    assert "spec.scheduling.gang: must be one of volcano, kueue, got 'slurm'" in text
    assert "spec.activeDeadlineSeconds" in text and "positive" in text
    assert "spec.replicaSpecs.worker.elasticPriorityClassName" in text
    kueue = "\n".join(problems(job(scheduling={"gang": "kueue"})))
    assert "spec.scheduling.gang kueue needs spec.scheduling.queue" in kueue, kueue


def test_the_input_object_is_not_modified():
    obj = job(volumes=[{"name": "v", "mountPath": "/v", "emptyDir": {}}])
    before = copy.deepcopy(obj)
    jobspec_from_resource(obj)
    pod_settings(obj, "master")
    assert obj == before


def test_a_setting_without_an_elasticjob_field_is_not_dropped():
    spec = JobSpec.of(name="ev", model_def="/zoo/m.py:Model", training_data="/d", job_dir="/j",
                      worker_memory_limit="2Gi")
    with pytest.raises(ResourceError, match=r"^JobSpec.worker.memory_limit: '2Gi' has no ElasticJob field yet"):
        resource_from_jobspec(spec, image="img")


def test_every_problem_is_reported_at_once_each_naming_its_field():
    obj = job(training__epochs=0, training__globalBatchSize=-1, training__stepsPerTask="many",
              training__epoch=3, replicaSpecs__worker__minReplicas=5, replicaSpecs__worker__replicas=3,
              replicaSpecs__worker__maxReplicas=2, replicaSpecs__ps__replicas=1,
              volumes=[{"name": "data", "mountPath": "/data", "persistentVolumeClam": {"claimName": "c"}}])
    found = problems(obj)
    assert [path_of(p) for p in found] == [
        "spec.training.epoch", "spec.volumes[0]", "spec.training.epochs", "spec.training.globalBatchSize",
        "spec.training.stepsPerTask", "spec.replicaSpecs.worker.minReplicas",
        "spec.replicaSpecs.worker.maxReplicas", "spec.replicaSpecs.ps.replicas"], found
    assert found[2] == "spec.training.epochs: must be a positive integer, got 0"
    assert "persistentVolumeClam" in found[1] and "needs spec.strategy" in found[-1]
    err = error_of(obj)
    assert err.problems == found and str(err) == "\n".join(found) and err.path == "spec.training.epoch"


def test_pod_templates_are_known_fields_checked_by_kubernetes_schema():
    good = {"metadata": {"labels": {"team": "ml"}},
            "spec": {"nodeSelector": {"pool": "cpu"}, "containers": [{"resources": {"limits": {"cpu": "2"}}}]}}
    assert problems(job(replicaSpecs__worker__template=good, replicaSpecs__master__template=good)) == []
    bad = {"spec": {"nodeSelectr": {"pool": "cpu"}, "tolerations": [{"effect": 3}],
                    "containers": [{"args": ["x"]}]}}
    found = problems(job(replicaSpecs__ps__template=bad, strategy="ParameterServer", replicaSpecs__ps__replicas=1))
    base = "spec.replicaSpecs.ps.template.spec"
    assert {path_of(p) for p in found} >= {f"{base}.nodeSelectr", f"{base}.containers[0].args",
                                            f"{base}.tolerations[0].effect"}, found


def test_a_bad_master_port_annotation_is_one_of_the_problems():
    obj = job(training__epochs=0)
    obj["metadata"]["annotations"] = {meta.ANNOTATION_MASTER_PORT: "http"}
    assert [path_of(p) for p in problems(obj)] == [
        "spec.training.epochs", f"metadata.annotations[{meta.ANNOTATION_MASTER_PORT}]"]


def test_max_micro_batch_auto_and_memory_limit_map_both_ways():
    spec = jobspec_from_resource(job(training__maxMicroBatch="auto", training__memoryLimit="3GiB"))
    assert (spec.training.max_micro_batch, spec.training.memory_limit) == ("auto", "3GiB")
    body = resource_from_jobspec(spec, image="flextrain:test")
    assert body["spec"]["training"]["maxMicroBatch"] == "auto" and body["spec"]["training"]["memoryLimit"] == "3GiB"
    assert jobspec_from_resource(body) == spec
    assert jobspec_from_resource(job(training__maxMicroBatch="auto",
                                     training__memoryLimit=2**31)).training.memory_limit == 2**31


@pytest.mark.parametrize("changes, problem", [
    (dict(training__maxMicroBatch="big"), "spec.training.maxMicroBatch: must be a positive integer or 'auto', got 'big'"),
    (dict(training__maxMicroBatch=0), "spec.training.maxMicroBatch: must be a positive integer or 'auto', got 0"),
    (dict(training__maxMicroBatch="auto", training__memoryLimit="12parsecs"),
     "spec.training.memoryLimit='12parsecs' is not a memory size"),
    (dict(training__maxMicroBatch="auto", training__memoryLimit=-1), "spec.training.memoryLimit: must be a number of bytes"),
    (dict(training__memoryLimit="2GiB"), "spec.training.memoryLimit applies to spec.training.maxMicroBatch auto only"),
    (dict(training__maxMicroBatch="auto", strategy="ParameterServer", replicaSpecs__ps={"replicas": 1}),
     "spec.training.maxMicroBatch auto needs spec.strategy AllReduce"),
])
def test_bad_auto_settings_name_their_field(changes, problem):
    found = problems(job(**changes))
    assert any(problem in p for p in found), found


def test_accelerate_maps_both_ways_and_the_operator_reads_it_as_the_workers_do():
    from flextrain.operator.jobview import accelerate_problems, spec_problems

    for value in ("auto", "amp_native:bf16,checkpoint:Block", '["channels_last", ["half", "bf16"]]'):
        spec = jobspec_from_resource(job(training__accelerate=value))
        assert spec.training.accelerate == value
        body = resource_from_jobspec(spec, image="flextrain:test")
        assert body["spec"]["training"]["accelerate"] == value and jobspec_from_resource(body) == spec
        assert accelerate_problems(body) == [] and spec_problems(body) is None
    assert "accelerate" not in resource_from_jobspec(jobspec_from_resource(job()), image="x")["spec"]["training"]


@pytest.mark.parametrize("changes, problem", [
    (dict(training__accelerate=""), "spec.training.accelerate: must be 'auto', a JSON strategy or a comma list"),
    (dict(training__accelerate=3), "spec.training.accelerate: must be a string, got 3"),
    (dict(training__accelerate="auto", strategy="ParameterServer", replicaSpecs__ps={"replicas": 1}),
     "spec.training.accelerate needs spec.strategy AllReduce"),
])
def test_bad_accelerate_settings_name_their_field(changes, problem):
    found = problems(job(**changes))
    assert any(problem in p for p in found), found


@pytest.mark.parametrize("value, problem", [
    ("amp_native:bf16,zero1", "spec.training.accelerate: zero1 ("),
    ("amp_natve", "spec.training.accelerate: unknown optimization method 'amp_natve'"),
    ("strategy.json", "spec.training.accelerate: 'strategy.json' looks like a file"),
])
def test_the_operator_refuses_what_a_job_cannot_apply_naming_the_method(value, problem):
    from flextrain.operator.jobview import spec_problems

    found = spec_problems(job(training__accelerate=value))
    assert found is not None and problem in found, found


def test_train_backend_kubernetes_puts_an_accelerate_file_in_the_elasticjob(tmp_path):
    """The pods may not see a strategy file on the submitting machine: its JSON goes into the ElasticJob."""
    from flextrain.accelerate import Strategy
    from flextrain.cli import make_parser
    from flextrain.cli.kubernetes import elasticjob_from_args

    path = Strategy(["parallel_mode", ("amp_native", "bf16")]).save(tmp_path / "fast.json")
    args = make_parser().parse_args(["train", "--backend", "kubernetes", "--model-def", "/opt/zoo/m.py:Model",
                                     "--training-data", "/data/train", "--job-name", "digits", "--namespace", "ns",
                                     "--image", "flextrain:test", "--accelerate", str(path)])
    body = elasticjob_from_args(args)
    assert Strategy.load(body["spec"]["training"]["accelerate"]) == Strategy.load(path)
    assert problems(body) == []


def test_a_data_secret_maps_both_ways_and_reaches_master_and_workers_not_ps():
    from flextrain.k8s.master_pod import master_pod
    from flextrain.k8s.pods import job_pod

    obj = job(data__training="postgresql+psycopg://ml@db/ml?table=train", data__secretRef="db-credentials")
    obj["metadata"]["uid"] = "1234-uid"
    spec = jobspec_from_resource(obj)
    assert spec.data.secret_ref == "db-credentials" and spec.data.training.startswith("postgresql+psycopg://ml@db")
    c = master_pod(obj, index=0)["spec"]["containers"][0]
    assert c["envFrom"] == [{"secretRef": {"name": "db-credentials"}}]
    for role, wanted in (("worker", [{"secretRef": {"name": "db-credentials"}}]), ("ps", None)):
        pod = job_pod(obj, role=role, index=0, pod_name=f"j-{role}-0", instance_id=f"{role}-0", args=[role],
                      env={}, master_address="m:1")
        assert pod["spec"]["containers"][0].get("envFrom") == wanted, role
    plain = job()
    plain["metadata"]["uid"] = "1234-uid"
    assert "envFrom" not in master_pod(plain, index=0)["spec"]["containers"][0]
