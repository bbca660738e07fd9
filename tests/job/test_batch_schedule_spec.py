"""--batch-schedule, --lr-rule and --reference-batch-size: what a JobSpec, the CLI and an ElasticJob accept."""

from __future__ import annotations

import pytest

from flextrain.job import JobSpec, JobSpecError, Strategy
from flextrain.k8s import resource
from flextrain.master.batches import job_schedule, step_settings
from ft_helpers import run_flextrain


def spec(**settings) -> JobSpec:
    return JobSpec.of(name="j", model_def="m.py:M", job_dir="/j", training_data="d", **settings)


def test_inline_and_path_traces_are_read(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("step,batchsize\n0,16\n1,32\n")
    assert job_schedule(spec(batch_schedule=str(trace)).validate()).sizes == (16, 32)
    inline = spec(batch_schedule="step,batchsize\n0,8\n", lr_rule="linear").validate()
    assert inline.training.inline_schedule and job_schedule(inline).sizes == (8,)
    assert job_schedule(spec()) is None


def test_status_settings_follow_the_trace_and_rule():
    s = spec(batch_schedule="step,batchsize\n0,16\n1,64\n", lr_rule="linear", reference_batch_size=32,
             learning_rate=0.1).validate()
    schedule = job_schedule(s)
    assert step_settings(s, schedule, 0) == {"globalBatchSize": 16, "lrRule": "linear", "lrFactor": 0.5,
                                             "learningRate": 0.05}
    assert step_settings(s, schedule, 7)["globalBatchSize"] == 64
    assert step_settings(spec(), None, 3) == {"globalBatchSize": 64, "lrRule": "none", "lrFactor": 1.0}


def test_status_settings_of_adascale_show_the_gain_the_workers_report():
    s = spec(lr_rule="adascale", reference_batch_size=32, learning_rate=0.1).validate()
    assert step_settings(s, None, 0) == {"globalBatchSize": 64, "lrRule": "adascale", "lrFactor": 1.0,
                                         "learningRate": 0.1}  # before any report: gain 1, no noise scale
    assert step_settings(s, None, 5, adascale=(1.25, 42.123456)) == {
        "globalBatchSize": 64, "lrRule": "adascale", "lrFactor": 1.25, "learningRate": 0.125,
        "gradientNoiseScale": 42.123}
    assert step_settings(s, None, 5, adascale=(1.0, float("inf")))["gradientNoiseScale"] == "inf"


@pytest.mark.parametrize("settings, named", [
    ({"lr_rule": "cubic"}, "--lr-rule must be one of none, linear, sqrt, adascale"),
    ({"lr_rule": "adascale", "strategy": Strategy.PARAMETER_SERVER, "ps": 1},
     "--lr-rule adascale needs --distribution-strategy AllReduce"),
    ({"reference_batch_size": 0}, "--reference-batch-size must be a positive integer"),
    ({"batch_schedule": "  "}, "--batch-schedule must be a path"),
    ({"batch_schedule": "t.csv", "strategy": Strategy.PARAMETER_SERVER, "ps": 1},
     "--batch-schedule needs --distribution-strategy AllReduce"),
])
def test_refused(settings, named):
    with pytest.raises(JobSpecError, match=named):
        spec(**settings).validate()


def test_a_bad_trace_file_is_named_by_line_at_submission(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("step,batchsize\n0,64\n2,64\n")
    result = run_flextrain("train", "--model-def", "no/such/module.py:M", "--training-data", str(tmp_path),
                           "--batch-schedule", str(trace), "--job-dir", str(tmp_path / "job"), "--no-preflight")
    assert result.returncode == 2
    assert f"{trace}: line 3: step 2 out of order: expected step 1" in result.stderr, result.stderr
    assert not (tmp_path / "job").exists()


def elasticjob(**training) -> dict:
    return {"apiVersion": "flextrain.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "j"},
            "spec": {"image": "i", "modelDef": "/m.py:M", "data": {"training": "/d"}, "training": training}}


def test_the_operator_reads_an_inline_trace_and_leaves_a_path_to_the_master():
    assert resource.problems(elasticjob(batchSchedule="step,batchsize\n0,32\n", lrRule="linear")) == []
    assert resource.problems(elasticjob(batchSchedule="/traces/t.csv")) == []  # in the pods: the master reads it
    assert resource.problems(elasticjob(batchSchedule="step,batchsize\n0,32\n1,-4\n")) == [
        "spec.training.batchSchedule: line 3: a batch size must be positive, got -4"]
    job = resource.jobspec_from_resource(elasticjob(batchSchedule="step,batchsize\n0,32\n", lrRule="sqrt",
                                                    referenceBatchSize=16))
    assert (job.training.lr_rule, job.training.reference_batch_size) == ("sqrt", 16)
    again = resource.resource_from_jobspec(job, image="i")
    assert again["spec"]["training"]["batchSchedule"] == "step,batchsize\n0,32\n"
    assert resource.jobspec_from_resource(again) == job


# ---- --batch-schedule adaptive ------------------------------------------------------------------
ADAPTIVE = {"batch_schedule": "adaptive", "min_global_batch": 16, "max_global_batch": 128}


def test_adaptive_implies_adascale_against_the_min_batch_and_status_shows_the_decisions():
    s = spec(**ADAPTIVE, adapt_every=10, learning_rate=0.1).validate()
    assert (s.training.effective_lr_rule, s.training.effective_reference_batch_size) == ("adascale", 16)
    schedule = job_schedule(s)
    assert (schedule.min_global_batch, schedule.max_global_batch, schedule.every) == (16, 128, 10)
    schedule.noise_scale = lambda: 70.0
    schedule.hand_out(10, epoch=0, max_steps=4)
    assert step_settings(s, schedule, 12, adascale=(2.0, 70.0)) == {
        "globalBatchSize": 64, "lrRule": "adascale", "lrFactor": 2.0, "learningRate": 0.2,
        "gradientNoiseScale": 70.0, "batchHistory": [[0, 16], [10, 64]]}
    assert spec(**ADAPTIVE, reference_batch_size=32).validate().training.effective_reference_batch_size == 32


@pytest.mark.parametrize("settings, named", [
    ({"batch_schedule": "adaptive"}, "--batch-schedule adaptive needs --min-global-batch and --max-global-batch"),
    ({"batch_schedule": "adaptive", "min_global_batch": 8}, "needs --max-global-batch"),
    ({**ADAPTIVE, "max_global_batch": 8}, "--min-global-batch 16 must be <= --max-global-batch 8"),
    ({**ADAPTIVE, "min_global_batch": 0}, "--min-global-batch must be a positive integer"),
    ({**ADAPTIVE, "adapt_every": 0}, "--adapt-every must be a positive integer"),
    ({**ADAPTIVE, "lr_rule": "linear"}, "--batch-schedule adaptive scales the LR by AdaScale's gain"),
    ({"min_global_batch": 8}, "--min-global-batch applies to --batch-schedule adaptive only"),
    ({"batch_schedule": "t.csv", "adapt_every": 5}, "--adapt-every applies to --batch-schedule adaptive only"),
    ({**ADAPTIVE, "strategy": Strategy.PARAMETER_SERVER, "ps": 1}, "needs --distribution-strategy AllReduce"),
])
def test_adaptive_refused(settings, named):
    with pytest.raises(JobSpecError, match=named):
        spec(**settings).validate()


def test_the_operator_maps_and_checks_the_adaptive_fields():
    ok = elasticjob(batchSchedule="adaptive", minGlobalBatch=8, maxGlobalBatch=64, adaptEvery=20)
    assert resource.problems(ok) == []
    job = resource.jobspec_from_resource(ok)
    assert (job.training.min_global_batch, job.training.max_global_batch, job.training.adapt_every) == (8, 64, 20)
    assert resource.jobspec_from_resource(resource.resource_from_jobspec(job, image="i")) == job
    assert any("minGlobalBatch 64 must be <= " in p
               for p in resource.problems(elasticjob(batchSchedule="adaptive", minGlobalBatch=64, maxGlobalBatch=8)))


def test_adaptive_without_bounds_exits_2_at_submission(tmp_path):
    result = run_flextrain("train", "--model-def", "no/such/module.py:M", "--training-data", str(tmp_path),
                           "--batch-schedule", "adaptive", "--min-global-batch", "32", "--job-dir",
                           str(tmp_path / "job"), "--no-preflight")
    assert result.returncode == 2
    assert "--batch-schedule adaptive needs --max-global-batch" in result.stderr, result.stderr
    assert not (tmp_path / "job").exists()
