"""Plain manifests and examples: generated from the chart, strictly valid, and consistent with the image and CLI.

`kubectl apply -f manifests/crd.yaml -f manifests/rbac.yaml -f manifests/operator.yaml`
must install exactly what `helm install flextrain charts/flextrain` installs
into namespace `default`; the examples must run with the image the Dockerfile
builds and the data `manifests/examples/data.yaml` writes.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import PurePosixPath

import kubernetes_validate
import pytest
import yaml
from k8s_static_support import CHART_DIR, EXAMPLES, REPO, kube_versions, load_docs

MANIFESTS = REPO / "manifests"
ALL_FILES = sorted(MANIFESTS.glob("*.yaml")) + sorted(EXAMPLES.glob("*.yaml"))
IMAGE_MODEL_ZOO = PurePosixPath("/opt/flextrain/model_zoo")  # where the Dockerfile copies model_zoo/
JOB_EXAMPLES = ("digits-allreduce.yaml", "ctr-ps.yaml", "digits-gpu.yaml", "digits-evaluate.yaml", "digits-predict.yaml")


def generator():
    spec = importlib.util.spec_from_file_location("manifests_generate", MANIFESTS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def elasticjob(name: str) -> dict:
    (job,) = [d for d in load_docs(EXAMPLES / name) if d["kind"] == "ElasticJob"]
    return job


def chart_image() -> str:
    return f"flextrain:{yaml.safe_load((CHART_DIR / 'Chart.yaml').read_text())['appVersion']}"


def test_expected_files_exist():
    names = {p.relative_to(MANIFESTS).as_posix() for p in ALL_FILES}
    assert {"crd.yaml", "rbac.yaml", "operator.yaml", "examples/digits-allreduce.yaml",
            "examples/ctr-ps.yaml", "examples/data.yaml"} <= names


def test_plain_manifests_are_the_chart_rendered_with_defaults():
    for filename, text in generator().plain_manifests().items():
        assert (MANIFESTS / filename).read_text() == text, \
            f"manifests/{filename} is stale: run .venv/bin/python manifests/generate.py"


def test_plain_manifests_target_default_namespace_without_helm_labels():
    for name in ("rbac.yaml", "operator.yaml"):
        for obj in load_docs(MANIFESTS / name):
            assert obj["metadata"].get("namespace") in (None, "default"), obj["metadata"]
            labels = obj["metadata"].get("labels", {})
            assert "helm.sh/chart" not in labels and labels.get("app.kubernetes.io/managed-by") != "Helm"


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.relative_to(MANIFESTS).as_posix())
def test_every_object_validates_strictly(path, elasticjob_validator):
    objs = load_docs(path)
    assert objs, f"{path} holds no objects"
    for obj in objs:
        if obj["kind"] == "ElasticJob":  # not in kubernetes-validate's schema set: checked against the CRD
            assert [e.message for e in elasticjob_validator.iter_errors(obj)] == [], obj["metadata"]["name"]
            continue
        for version in kube_versions():
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{path.name}: {obj['kind']}/{obj['metadata']['name']} invalid for {version}: {e}")


def test_examples_use_the_image_the_chart_installs():
    images = [elasticjob(n)["spec"]["image"] for n in JOB_EXAMPLES]
    images += [c["image"] for job in load_docs(EXAMPLES / "data.yaml") if job["kind"] == "Job"
               for c in job["spec"]["template"]["spec"]["containers"]]
    assert set(images) == {chart_image()}


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_maps_to_a_valid_jobspec(name):
    """The operator's own translation (flextrain.k8s.resource) accepts the example."""
    from flextrain.job import Strategy
    from flextrain.k8s.resource import jobspec_from_resource

    job = elasticjob(name)
    spec = jobspec_from_resource(job)
    workers = job["spec"]["replicaSpecs"]["worker"]
    assert (spec.name, spec.worker.replicas, spec.worker.min_replicas, spec.worker.max_replicas) == (
        job["metadata"]["name"], workers["replicas"], workers["minReplicas"], workers["maxReplicas"])
    assert spec.strategy is Strategy(job["spec"].get("strategy", "AllReduce"))
    assert spec.ps.replicas == job["spec"]["replicaSpecs"].get("ps", {}).get("replicas", 0)


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_model_def_is_a_model_zoo_module_baked_into_the_image(name):
    from flextrain.worker.module import load_model_def

    path, _, attr = elasticjob(name)["spec"]["modelDef"].partition(":")
    in_image = PurePosixPath(path)
    assert in_image.parent == IMAGE_MODEL_ZOO, in_image
    local = REPO / "model_zoo" / in_image.name
    assert local.is_file(), local
    load_model_def(f"{local}:{attr}")  # raises, naming the missing piece, if the module breaks the contract


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_paths_live_on_mounted_volumes(name):
    """Data and the job directory must be on a volume of the job (or they vanish with the pod)."""
    spec = elasticjob(name)["spec"]
    mounts = [PurePosixPath(v["mountPath"]) for v in spec["volumes"]]
    for path in [*spec["data"].values(), spec["jobDir"], *(spec[k] for k in ("checkpoint", "output") if k in spec)]:
        assert any(PurePosixPath(path).is_relative_to(m) for m in mounts), f"{name}: {path} is on no volume"
    (pvc,) = [d for d in load_docs(EXAMPLES / "data.yaml") if d["kind"] == "PersistentVolumeClaim"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]} == {pvc["metadata"]["name"]}


def test_data_jobs_write_what_the_examples_read():
    """The data Jobs' args are real `flextrain data ...` commands, writing <out>/train and <out>/validation."""
    from flextrain.cli import make_parser

    parser = make_parser()
    written = {}
    for job in load_docs(EXAMPLES / "data.yaml"):
        if job["kind"] != "Job":
            continue
        (container,) = job["spec"]["template"]["spec"]["containers"]
        args = parser.parse_args(container["args"])
        assert args.command == "data", container["args"]
        written[args.dataset] = args.out
    assert written.keys() == {"digits", "ctr"}
    for name, dataset in (("digits-allreduce.yaml", "digits"), ("ctr-ps.yaml", "ctr")):
        data = elasticjob(name)["spec"]["data"]
        assert data == {"training": f"{written[dataset]}/train", "validation": f"{written[dataset]}/validation"}


def test_operator_deployment_runs_a_real_cli_command():
    """`flextrain operator --namespace default` must parse with the CLI the image ships."""
    from flextrain.cli import make_parser

    parser = make_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if "operator" not in subcommands:
        pytest.skip("`flextrain operator` is not in flextrain/cli/ yet")
    (deployment,) = load_docs(MANIFESTS / "operator.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = parser.parse_args(container["args"])
    assert args.command == "operator"
