"""--spare-workers K: one setting under one name from the flag to the JobSpec (worker.spares), the
ElasticJob (spec.replicaSpecs.worker.spares) and the worker's command line; bad values are refused
naming the flag (or the field) and the reason."""

from __future__ import annotations

import pytest

from flextrain.cli import build_spec, make_parser
from flextrain.job import JobSpecError
from flextrain.k8s import crdschema
from flextrain.k8s.resource import jobspec_from_resource, problems, resource_from_jobspec


def spec(tmp_path, *extra):
    return build_spec(make_parser().parse_args(
        ["train", "--model-def", "m.py:Model", "--training-data", "d", "--job-dir", str(tmp_path), *extra]))


def test_the_flag_reaches_the_jobspec_and_the_elasticjob(tmp_path):
    assert spec(tmp_path).worker.spares == 0
    job = spec(tmp_path, "--spare-workers", "2").validate()
    assert job.worker.spares == 2
    resource = resource_from_jobspec(job, image="flextrain:test", namespace="default")
    assert resource["spec"]["replicaSpecs"]["worker"]["spares"] == 2
    assert crdschema.problems(resource) == [] and problems(resource) == []
    assert jobspec_from_resource(resource).worker.spares == 2


@pytest.mark.parametrize("extra, words", [
    (("--spare-workers", "-1"), "--spare-workers must be an integer >= 0, got -1"),
    (("--spare-workers", "1", "--distribution-strategy", "ParameterServer", "--ps", "1"),
     "--spare-workers needs --distribution-strategy AllReduce"),
])
def test_bad_spares_are_refused_naming_the_flag(tmp_path, extra, words):
    with pytest.raises(JobSpecError, match=words):
        spec(tmp_path, *extra).validate()


def test_the_crd_and_the_operator_refuse_a_negative_count(tmp_path):
    resource = resource_from_jobspec(spec(tmp_path).validate(), image="flextrain:test", namespace="default")
    resource["spec"]["replicaSpecs"]["worker"]["spares"] = -1
    assert any("spares" in p for p in crdschema.problems(resource))  # the API server's schema check
    assert any("spec.replicaSpecs.worker.spares" in p for p in problems(resource))  # the operator's own
    resource["spec"]["replicaSpecs"]["worker"]["spares"] = 1
    resource["spec"]["strategy"], resource["spec"]["replicaSpecs"]["ps"] = "ParameterServer", {"replicas": 1}
    assert any("spec.replicaSpecs.worker.spares" in p and "AllReduce" in p for p in problems(resource))


def test_a_resume_may_change_the_number_of_spares(tmp_path):
    from flextrain.master.resume import resumed_spec

    (tmp_path / "jobspec.json").write_text(spec(tmp_path).validate().to_json())
    resumed = resumed_spec(tmp_path, {"spares": 2})
    assert resumed.spec.worker.spares == 2 and resumed.changes == ("--spare-workers 0 -> 2",)
