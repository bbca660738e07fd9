"""One name per idea: the settings table (flextrain/job/settings.py SETTINGS) ties each setting's CLI flag,
JobSpec path and ElasticJob path together, and these tests hold the three to it. Where each CRD path
exists in manifests/crd.yaml (with JobSpec's default) is checked in tests/k8s_static/test_crd_schema.py."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from flextrain.cli import make_parser
from flextrain.job import SECTIONS, SETTING, SETTINGS, JobSpec, flag_of
from flextrain.k8s import resource
from flextrain.master.resume import CHANGEABLE

# Settings `flextrain train` does not take, and the command that does.
ELSEWHERE = {"job_type": "the command itself (train, evaluate, predict)",
             "checkpoint": "flextrain evaluate/predict --checkpoint",
             "prediction_data": "flextrain predict --prediction-data",
             "output": "flextrain predict --output",
             "script": "flextrain run SCRIPT", "script_args": "flextrain run SCRIPT ARGS"}


def actions(command: str) -> dict[str, str]:
    """``{option: dest}`` of a command."""
    parser = make_parser()
    sub = parser.train_parser if command == "train" else None
    if sub is None:
        action = next(a for a in parser._actions if a.dest == "command")
        sub = action.choices[command]
    return {opt: a.dest for a in sub._actions for opt in a.option_strings}


def jobspec_leaves() -> set[str]:
    """Every value-holding path of a JobSpec: top-level fields and each section's fields."""
    out = set()
    for field in dataclasses.fields(JobSpec):
        if field.name in SECTIONS:
            out |= {f"{field.name}.{f.name}" for f in dataclasses.fields(SECTIONS[field.name])}
        else:
            out.add(field.name)
    return out


def snake(camel: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", lambda m: "_" + m.group(1).lower(), camel)


def test_every_jobspec_field_is_one_row_of_the_table():
    paths = [s.path for s in SETTINGS]
    assert len(paths) == len(set(paths)) and len(SETTING) == len(SETTINGS), "a path or key is in the table twice"
    assert set(paths) == jobspec_leaves(), (
        f"JobSpec fields without a row: {sorted(jobspec_leaves() - set(paths))}; "
        f"rows without a JobSpec field: {sorted(set(paths) - jobspec_leaves())}")


def test_jobspec_sections_mirror_the_elasticjob():
    """A JobSpec path is its ElasticJob path in snake_case (replicaSpecs.worker -> worker)."""
    for s in SETTINGS:
        if s.crd and s.crd.startswith("spec."):
            mirrored = ".".join(snake(p) for p in s.crd.removeprefix("spec.").removeprefix("replicaSpecs.").split("."))
            assert s.path == mirrored, f"{s.key}: JobSpec path {s.path} does not mirror {s.crd}"


def test_every_setting_is_a_train_flag_with_its_key_as_dest():
    train = actions("train")
    wrong = []
    for s in SETTINGS:
        if s.key in ELSEWHERE:
            continue
        dest = train.get(s.option)
        expected = "no_" + s.key if s.option.startswith("--no-") else s.key
        if s.key == "name":
            expected = "job_name"
        elif s.key == "strategy":
            expected = "distribution_strategy"
        if dest != expected:
            wrong.append((s.key, s.option, dest))
    assert not wrong, f"settings whose flag is missing or sets another dest: {wrong}"


def test_settings_set_by_other_commands_are_their_flags():
    assert {"--checkpoint", "--prediction-data", "--output"} <= set(actions("predict"))
    assert "--checkpoint" in actions("evaluate")
    run = next(a for a in make_parser()._actions if a.dest == "command").choices["run"]
    assert {"script", "script_args"} <= {a.dest for a in run._actions}  # its positionals


def test_flag_of_takes_keys_and_paths():
    assert flag_of("learning_rate") == flag_of("training.learning_rate") == "--lr"
    assert flag_of("workers") == flag_of("worker.replicas") == "--workers"


def test_the_operator_maps_exactly_the_crd_column():
    assert [(f"spec.{f.path}", f.key) for f in resource.FIELDS] == [
        (s.crd, s.key) for s in SETTINGS if s.crd and s.crd.startswith("spec.")]


def test_resume_names_jobspec_paths():
    assert set(CHANGEABLE) < {s.path for s in SETTINGS}


def test_of_replace_get_and_settings_speak_keys():
    spec = JobSpec.of(name="j", model_def="m.py:M", job_dir="/j", training_data="d", workers=3, ps=2, ps_wal=False)
    assert (spec.worker.replicas, spec.ps.replicas, spec.ps.ps_wal, spec.data.training) == (3, 2, False, "d")
    again = spec.replace(workers=5, epochs=2)
    assert (again.worker.replicas, again.training.epochs, again.ps.replicas) == (5, 2, 2)
    assert again.get("workers") == again.get("worker.replicas") == 5
    assert list(spec.settings()) == [s.key for s in SETTINGS]


def test_the_architecture_page_shows_the_table():
    page = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    shown = page.split("<!-- settings-table", 1)[1].split("<!-- /settings-table -->", 1)[0]
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")]
            for line in shown.splitlines() if line.startswith("| ") and not line.startswith("| flag ")]
    assert rows == [[s.option, s.path, s.crd or "—"] for s in SETTINGS], (
        "docs/architecture.md's settings table differs from flextrain.job.SETTINGS; regenerate it")
