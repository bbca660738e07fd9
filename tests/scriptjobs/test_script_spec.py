"""A script job's JobSpec: a script or a module, never both; no data flags; survives JSON."""

from __future__ import annotations

import pytest

from flextrain.job import Backend, JobSpec, JobSpecError
from flextrain.k8s import resource


def spec(model_def="", job_dir="/j", **settings):
    return JobSpec.of(name="s", model_def=model_def, job_dir=job_dir, **settings)


def test_a_script_job_round_trips_through_json():
    job = spec(script="/x/train.py", script_args=["--steps", "3"], workers=2).validate()
    assert job.is_script and job.script_args == ("--steps", "3")
    assert JobSpec.from_json(job.to_json()) == job


@pytest.mark.parametrize("settings, problem", [
    ({"script": "/x/t.py", "model_def": "m.py:M"}, "not both"),
    ({"script": "/x/t.py", "training_data": "/d"}, "--training-data applies to module jobs"),
    ({"script_args": ["--a"]}, "script arguments need a script"),
    ({}, "--model-def is required"),
    ({"script": "/x/t.py", "script_args": [3]}, "must be strings"),
])
def test_refused_script_jobs_name_the_problem(settings, problem):
    with pytest.raises(JobSpecError, match=problem):
        spec(**settings).validate()


def test_an_elasticjob_with_a_script_round_trips_and_runs_the_script():
    job = spec(script="/app/train.py", script_args=["--steps", "9"], workers=2, max_workers=3,
               backend=Backend.KUBERNETES, job_dir="/flextrain-jobs/s").validate()
    obj = resource.resource_from_jobspec(job, image="img")
    assert obj["spec"]["script"] == "/app/train.py" and obj["spec"]["scriptArgs"] == ["--steps", "9"]
    assert "modelDef" not in obj["spec"] and "data" not in obj["spec"]
    assert resource.jobspec_from_resource(obj) == job


@pytest.mark.parametrize("change, problem", [
    ({"script": None}, "spec.modelDef: is required (or spec.script, for a script job)"),
    ({"modelDef": "m.py:M"}, "not both"),
    ({"scriptArgs": [1]}, "spec.scriptArgs: must be a list of strings"),
    ({"data": {"training": "/d"}}, "spec.data.training applies to module jobs"),
])
def test_the_operator_refuses_a_bad_script_job_naming_the_field(change, problem):
    obj = {"apiVersion": "flextrain.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "s"},
           "spec": {"image": "img", "script": "/app/train.py", "replicaSpecs": {"worker": {"replicas": 1}}}}
    obj["spec"].update(change)
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    found = resource.problems(obj)
    assert any(problem in p for p in found), found


def test_options_after_the_script_are_the_scripts_even_as_prefixes_of_ours():
    """`--n 5` after SCRIPT went to argparse's prefix matching (ambiguous: --no-progress, --no-metrics, ...)."""
    from flextrain.cli import make_parser

    args, extra = make_parser().parse_known_args(
        ["run", "--workers", "2", "train.py", "--n", "2048", "--no", "1", "--m", "x", "--workers", "3"])
    assert (args.script, args.workers, extra) == ("train.py", 2, [])
    assert args.script_args == ["--n", "2048", "--no", "1", "--m", "x", "--workers", "3"]
