"""JobSpec validation and JSON round-trip."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flextrain.job import Backend, JobSpec, JobSpecError, JobType, Strategy


def spec(**changes) -> JobSpec:
    base = JobSpec.of(name="digits", model_def="model_zoo/digits_torch.py:Model",
                   training_data="/data/train", job_dir="/tmp/jobs/digits")
    return base.replace(**changes)


def test_defaults_validate_and_validate_returns_self():
    s = spec()
    assert s.validate() is s
    assert (s.worker.effective_min_replicas, s.worker.effective_max_replicas) == (1, 1)
    assert s.training.effective_max_micro_batch == s.training.global_batch_size == 64
    assert s.checkpoint_dir.as_posix() == "/tmp/jobs/digits/checkpoints"


@pytest.mark.parametrize(
    "changes, needle",
    [
        (dict(workers=0), "--workers must be a positive integer, got 0"),
        (dict(workers=-2), "--workers must be a positive integer"),
        (dict(workers=True), "--workers must be a positive integer"),
        (dict(workers=1.5), "--workers must be a positive integer"),
        (dict(epochs=0), "--epochs must be a positive integer"),
        (dict(global_batch_size=0), "--global-batch-size must be a positive integer"),
        (dict(global_batch_size=-64), "--global-batch-size must be a positive integer"),
        (dict(steps_per_task=0), "--steps-per-task must be a positive integer"),
        (dict(max_micro_batch=0), "--max-micro-batch must be a positive integer"),
        (dict(min_workers=0), "--min-workers must be a positive integer"),
        (dict(max_workers=-1), "--max-workers must be a positive integer"),
        (dict(workers=2, min_workers=3, max_workers=2), "--min-workers (3) is greater than --max-workers (2)"),
        (dict(min_workers=2), "--min-workers (2) is greater than --workers (1)"),  # --max-workers not given
        (dict(workers=3, max_workers=2), "--workers (3) is greater than --max-workers (2)"),
        (dict(workers=5, min_workers=1, max_workers=4), "--workers (5) must lie between --min-workers (1)"),
        (dict(workers=1, min_workers=2, max_workers=4), "--workers (1) must lie between"),
        (dict(learning_rate=0.0), "--lr must be positive"),
        (dict(learning_rate=-0.1), "--lr must be positive"),
        (dict(learning_rate=float("nan")), "--lr must be positive"),
        (dict(max_task_retries=-1), "--max-task-retries"),
        (dict(checkpoint_steps=-1), "--checkpoint-steps"),
        (dict(memory_checkpoint_persist_every=0), "--memory-checkpoint-persist-every must be a positive integer"),
        (dict(memory_checkpoint_persist_seconds=-1.0), "--memory-checkpoint-persist-seconds must be a number of "
                                                       "seconds >= 0 (0: no time rule), got -1.0"),
        (dict(memory_checkpoint_persist_seconds=float("inf")), "--memory-checkpoint-persist-seconds must be"),
        (dict(model_def=""), "--model-def is required"),
        (dict(training_data=""), "--training-data is required"),
    ],
)
def test_bad_field_names_the_flag(changes, needle):
    with pytest.raises(JobSpecError) as info:
        spec(**changes).validate()
    assert needle in str(info.value)


@pytest.mark.parametrize("name", ["", "Digits", "my_job", "-job", "job-", "job.one", "a" * 54, "jöb"])
def test_bad_job_name(name):
    with pytest.raises(JobSpecError, match="job name"):
        spec(name=name).validate()


@pytest.mark.parametrize("name", ["a", "job-1", "0abc", "a" * 53])
def test_good_job_names(name):
    assert spec(name=name).validate().name == name


def test_valid_elastic_range():
    s = spec(workers=3, min_workers=1, max_workers=8, max_micro_batch=16, learning_rate=0.1).validate()
    assert (s.worker.effective_min_replicas, s.worker.effective_max_replicas, s.training.effective_max_micro_batch) == (1, 8, 16)


def test_job_spec_error_is_value_error():
    assert issubclass(JobSpecError, ValueError)


def test_json_round_trip_all_fields():
    s = spec(
        validation_data="/data/val", strategy=Strategy.PARAMETER_SERVER, backend=Backend.KUBERNETES,
        workers=3, min_workers=2, max_workers=5, epochs=4, global_batch_size=100, max_micro_batch=16,
        learning_rate=0.05, seed=9, shuffle=True, steps_per_task=3, max_task_retries=0,
        checkpoint_steps=50, rendezvous_timeout=2.5, worker_timeout=30.0, relaunch_budget=7,
    )
    text = s.to_json()
    data = json.loads(text)
    assert data["strategy"] == "ParameterServer" and data["backend"] == "kubernetes"
    assert set(data) == {f.name for f in dataclasses.fields(JobSpec)}
    assert data["worker"]["replicas"] == 3 and data["training"]["learning_rate"] == 0.05  # nested as the CRD
    back = JobSpec.from_json(text)
    assert back == s
    assert back.strategy is Strategy.PARAMETER_SERVER and back.backend is Backend.KUBERNETES
    assert back.to_json() == text


def test_json_round_trip_defaults_and_nones():
    s = spec()
    back = JobSpec.from_json(s.to_json())
    assert back == s
    assert back.worker.min_replicas is None and back.training.learning_rate is None and back.data.validation is None


def test_from_json_defaults_missing_optional_fields():
    back = JobSpec.from_json(json.dumps({"name": "x", "model_def": "m.py:M", "data": {"training": "d"},
                                         "job_dir": "j"}))
    assert back.strategy is Strategy.ALLREDUCE and back.backend is Backend.LOCAL and back.worker.replicas == 1


def test_from_json_reads_the_flat_form_older_job_directories_hold():
    """jobspec.json written before the sections existed: every setting at the top level by key."""
    flat = {"name": "x", "model_def": "m.py:M", "training_data": "d", "job_dir": "j", "workers": 3, "ps": 0,
            "learning_rate": 0.1, "ps_wal": False, "strategy": "AllReduce", "epochs": 2}
    back = JobSpec.from_json(json.dumps(flat))
    assert back == spec(name="x", model_def="m.py:M", training_data="d", job_dir="j", workers=3, learning_rate=0.1,
                        ps_wal=False, epochs=2)
    assert json.loads(back.to_json())["worker"]["replicas"] == 3  # and it is written back nested


def test_from_json_rejects_unknown_fields():
    data = json.loads(spec().to_json())
    data["gpus"] = 2
    data["zeta"] = 1
    data["training"]["epoch"] = 1
    with pytest.raises(JobSpecError, match="unknown JobSpec fields: gpus, training.epoch, zeta"):
        JobSpec.from_json(json.dumps(data))


def test_from_json_names_a_section_that_is_no_object():
    data = json.loads(spec().to_json())
    data["training"] = 5
    with pytest.raises(JobSpecError, match="section 'training' must be an object"):
        JobSpec.from_json(json.dumps(data))


def test_from_json_rejects_unknown_strategy():
    data = json.loads(spec().to_json())
    data["strategy"] = "Horovod"
    with pytest.raises(ValueError):
        JobSpec.from_json(json.dumps(data))


# ---- --max-micro-batch auto and --memory-limit ------------------------------------------------------
def test_auto_micro_batch_and_memory_limit_validate_and_round_trip():
    s = spec(max_micro_batch="auto", memory_limit="2GiB", global_batch_size=128).validate()
    assert s.training.auto_micro_batch and s.training.effective_max_micro_batch == 128  # the probe's upper bound
    assert JobSpec.from_json(s.to_json()) == s
    assert spec(max_micro_batch="auto", memory_limit=2**30).validate().training.memory_limit == 2**30


@pytest.mark.parametrize("changes, needle", [
    (dict(max_micro_batch="big"), "--max-micro-batch must be a positive integer or 'auto', got 'big'"),
    (dict(max_micro_batch=True), "--max-micro-batch must be a positive integer or 'auto'"),
    (dict(max_micro_batch="auto", memory_limit=-1), "--memory-limit must be a number of bytes or a size"),
    (dict(max_micro_batch="auto", memory_limit=""), "--memory-limit must be a number of bytes or a size"),
    (dict(memory_limit="2GiB"), "--memory-limit applies to --max-micro-batch auto only"),
    (dict(max_micro_batch="auto", strategy=Strategy.PARAMETER_SERVER, ps=1),
     "--max-micro-batch auto needs --distribution-strategy AllReduce: the probe measures a worker's whole "
     "training step"),
])
def test_bad_auto_settings_name_the_flag(changes, needle):
    with pytest.raises(JobSpecError) as info:
        spec(**changes).validate()
    assert needle in str(info.value)


# ---- --accelerate ----------------------------------------------------------------------------------
def test_accelerate_validates_and_round_trips():
    s = spec(accelerate="amp_native:bf16,checkpoint:Block").validate()
    assert JobSpec.from_json(s.to_json()) == s and not s.training.auto_accelerate
    assert spec(accelerate=" auto ").validate().training.auto_accelerate
    assert spec().training.accelerate is None and not spec().training.auto_accelerate


@pytest.mark.parametrize("changes, needle", [
    (dict(accelerate=""), "--accelerate must be 'auto', a JSON strategy or a comma list of methods"),
    (dict(accelerate=["amp_native"]), "--accelerate must be 'auto'"),
    (dict(accelerate="auto", strategy=Strategy.PARAMETER_SERVER, ps=1),
     "--accelerate needs --distribution-strategy AllReduce: with ParameterServer the parameter servers hold the "
     "weights"),
    (dict(accelerate="auto", job_type=JobType.EVALUATION, checkpoint="/c.ckpt", validation_data="/v"),
     "--accelerate applies to training jobs, not to evaluation jobs"),
    (dict(accelerate="auto", model_def="", training_data=None, script="/train.py"),
     "--accelerate applies to module jobs; a script calls auto_accelerate itself"),
])
def test_bad_accelerate_settings_name_the_flag(changes, needle):
    with pytest.raises(JobSpecError) as info:
        spec(**changes).validate()
    assert needle in str(info.value)
