"""A script job's JobSpec: a script or a module, never both; no data flags; survives JSON."""

from __future__ import annotations

import pytest

from flextrain.job import JobSpec, JobSpecError


def spec(model_def="", **settings):
    return JobSpec.of(name="s", model_def=model_def, job_dir="/j", **settings)


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
