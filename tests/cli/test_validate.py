"""`flextrain validate` checks ElasticJob YAML offline and lists every problem, each with its field path."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from ft_helpers import REPO, run_flextrain
from flextrain.cli import main

EXAMPLES = REPO / "manifests" / "examples"
JOB_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.yaml") if "kind: ElasticJob" in p.read_text())

# One spec, many mistakes: each line of EXPECTED must be reported, none hides another.
BAD = textwrap.dedent("""\
    apiVersion: flextrain.dev/v1alpha1
    kind: ElasticJob
    metadata: {name: bad}
    spec:
      image: flextrain:0.1.0
      imagePullPolicy: Sometimes
      modelDef: no_loss.py:Model
      colour: blue
      data: {training: /data/train}
      training: {epochs: 0, learningRate: 0.1, accelerate: "zero2,half:bf16"}
      replicaSpecs:
        worker:
          replicas: 3
          minReplicas: 4
          maxReplicas: 2
          env: [{name: FLEXTRAIN_RANK, value: "7"}]
          template:
            spec:
              nodeSelector: {pool: cpu}
              containers: [{command: [sh], resources: {limits: {cpu: "2"}}}]
      volumes:
        - {name: data, mountPath: /data, persistentVolumeClam: {claimName: flextrain-data}}
    """)
EXPECTED = {
    "spec.training.epochs: must be a positive integer, got 0",
    "spec.training.accelerate: zero2 (",  # what a job refuses (flextrain.accelerate.jobs), as the operator does
    "spec.colour: unknown field",
    "spec.volumes[0]: unknown field ('persistentVolumeClam' was unexpected)",
    "spec.replicaSpecs.worker.template.spec.containers[0].command: is set by flextrain",
    "spec.replicaSpecs.worker.minReplicas (4) > replicas (3)",
    "spec.replicaSpecs.worker.maxReplicas (2) < replicas (3)",
    "spec.replicaSpecs.worker.env[0].name: 'FLEXTRAIN_RANK' is set by flextrain",
    "spec.imagePullPolicy: 'Sometimes' is not one of ['Always', 'IfNotPresent', 'Never']",  # the CRD schema's
    "spec.modelDef: ",  # the module's contract: no loss
}
# A module that satisfies the contract except for `loss`; no framework import, so the check is quick.
NO_LOSS = "def Model():\n    return None\n\n\ndef optimizer(params, lr=0.1):\n    return None\n\n\n" \
          "def feed(records, mode, metadata):\n    return records, records\n"


def validate(capsys, *files) -> tuple[int, list[str], str]:
    code = main(["validate", *map(str, files)])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


@pytest.mark.parametrize("example", JOB_EXAMPLES, ids=lambda p: p.name)
def test_every_shipped_example_is_valid(capsys, example):
    code, lines, err = validate(capsys, example)
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(example.read_text()) if d and d["kind"] == "ElasticJob"]
    assert code == 0, (lines, err)
    assert [f"{example}: valid ElasticJob {n}" for n in names] == [ln for ln in lines if "valid ElasticJob" in ln]
    # The image's paths are not on this machine: said so, not silently skipped.
    assert any("spec.modelDef" in ln and "not checked" in ln for ln in lines), lines


def test_every_problem_is_listed_with_file_and_path(capsys, tmp_path, monkeypatch):
    (tmp_path / "no_loss.py").write_text(NO_LOSS)
    (tmp_path / "bad.yaml").write_text(BAD)
    monkeypatch.chdir(tmp_path)  # modelDef is relative: reachable from here, so its contract is checked
    code, lines, _ = validate(capsys, "bad.yaml")
    assert code == 1
    assert all(ln.startswith("bad.yaml: ") for ln in lines), lines
    for expected in EXPECTED:
        assert any(ln.startswith(f"bad.yaml: {expected}") for ln in lines), f"{expected!r} not in {lines}"
    assert any("`loss`" in ln for ln in lines if ln.startswith("bad.yaml: spec.modelDef: ")), lines
    assert not any("learningRate" in ln for ln in lines), lines  # OpenAPI's boolean exclusiveMinimum read right
    # One message per field: the schema's wording is dropped where the operator already blames the field.
    assert sum("spec.training.epochs" in ln for ln in lines) == 1 and sum("spec.colour" in ln for ln in lines) == 1


def test_each_elasticjob_of_a_multi_document_file_is_checked(capsys, tmp_path):
    good = (JOB_EXAMPLES[0]).read_text()
    bad = BAD.replace("modelDef: no_loss.py:Model", "modelDef: /nowhere/m.py:Model")
    pvc = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data}\n"
    path = tmp_path / "jobs.yaml"
    path.write_text(f"{good}\n---\n{pvc}---\n{bad}")
    code, lines, _ = validate(capsys, path)
    assert code == 1
    assert any(ln.startswith(f"{path} (document 1): valid ElasticJob") for ln in lines), lines
    assert any(ln.startswith(f"{path} (document 3): spec.training.epochs") for ln in lines), lines
    assert not any("document 2" in ln for ln in lines), lines  # not an ElasticJob: not ours to check


@pytest.mark.parametrize("text, words", [
    ("spec: [unclosed\n", "not YAML: line 2"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "no ElasticJob in it (found: ConfigMap)"),
    ("apiVersion: flextrain.dev/v1\nkind: ElasticJob\nmetadata: {name: x}\n",
     "apiVersion: expected flextrain.dev/v1alpha1"),
])
def test_a_file_that_is_no_elasticjob_exits_2(capsys, tmp_path, text, words):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    code, lines, err = validate(capsys, path)
    assert code == 2 and words in err, err


def test_a_glob_skips_files_of_other_kubernetes_objects_with_a_note(capsys):
    """`flextrain validate manifests/examples/*.yaml` also gets data.yaml (the PVC and Jobs the examples
    need): among several files, a file without an ElasticJob is skipped, not an error."""
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert EXAMPLES / "data.yaml" in files
    code, lines, err = validate(capsys, *files)
    assert code == 0, (lines, err)
    assert f"{EXAMPLES / 'data.yaml'}: note: no ElasticJob in it (found: Job, PersistentVolumeClaim): skipped" \
        in lines, lines


def test_files_with_no_elasticjob_at_all_still_exit_2(capsys, tmp_path):
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    (tmp_path / "b.yaml").write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: y}\n")
    (tmp_path / "values.yaml").write_text("image: {tag: x}\n")  # not a Kubernetes object: a mistake
    code, _, err = validate(capsys, tmp_path / "a.yaml", tmp_path / "b.yaml")
    assert code == 2 and "no ElasticJob in any of the 2 files given" in err, err
    code, _, err = validate(capsys, tmp_path / "values.yaml", JOB_EXAMPLES[0])
    assert code == 2 and "values.yaml: no ElasticJob in it" in err, err


def test_a_bad_quantity_says_what_a_quantity_is(capsys, tmp_path):
    from flextrain.k8s import crdschema

    job = yaml.safe_load((EXAMPLES / "digits-allreduce.yaml").read_text())
    job["spec"].setdefault("replicaSpecs", {}).setdefault("worker", {})["resources"] = {"limits": {"memory": "2GB"}}
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(job))
    code, lines, _ = validate(capsys, tmp_path / "q.yaml")
    assert code == 1
    (line,) = [ln for ln in lines if "limits.memory" in ln]
    assert "'2GB' is not a Kubernetes quantity" in line and "write 2G (powers of 1000) or 2Gi" in line, line
    assert "does not match" not in line  # not the CRD's regex
    # The CRD schema's own message (what the operator's check hides here) says the same.
    assert any("'2GB' is not a Kubernetes quantity" in p for p in crdschema.problems(job))


def test_a_missing_file_exits_2_and_the_others_are_still_checked(capsys, tmp_path):
    code, lines, err = validate(capsys, tmp_path / "nope.yaml", JOB_EXAMPLES[0])
    assert code == 2 and "nope.yaml: cannot read it" in err
    assert any("valid ElasticJob" in ln for ln in lines)


def test_the_installed_command_runs(tmp_path):
    """As a user runs it: a child process, the CRD found as package data (not through the repository)."""
    (tmp_path / "bad.yaml").write_text(BAD.replace("no_loss.py", "/nowhere/no_loss.py"))
    (tmp_path / "text.yaml").write_text("just: [text\n")
    ok = run_flextrain("validate", *map(str, JOB_EXAMPLES), timeout=120, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.count("valid ElasticJob") == len(JOB_EXAMPLES), ok.stdout + ok.stderr
    bad = run_flextrain("validate", "bad.yaml", timeout=120, cwd=tmp_path)
    assert bad.returncode == 1 and "bad.yaml: spec.training.epochs: must be a positive integer, got 0" in bad.stdout
    broken = run_flextrain("validate", "text.yaml", timeout=120, cwd=tmp_path)
    assert broken.returncode == 2 and "text.yaml: not YAML" in broken.stderr
