"""One name per idea: every JobSpec field is a `flextrain train` flag of the same name (flag_of), or
a flag of the command that sets it; the CRD side is checked in tests/k8s_static/test_crd_schema.py."""

from __future__ import annotations

import dataclasses

from flextrain.cli import make_parser
from flextrain.job import JobSpec, flag_of

# Fields `flextrain train` does not take, and the command that does.
ELSEWHERE = {"job_type": "the command itself (train, evaluate, predict)",
             "checkpoint": "flextrain evaluate/predict --checkpoint",
             "prediction_data": "flextrain predict --prediction-data",
             "output": "flextrain predict --output"}


def options(command: str) -> set[str]:
    parser = make_parser()
    sub = parser.train_parser if command == "train" else None
    if sub is None:
        action = next(a for a in parser._actions if a.dest == "command")
        sub = action.choices[command]
    return {opt for a in sub._actions for opt in a.option_strings}


def test_every_jobspec_field_is_a_train_flag_of_its_name():
    train = options("train")
    missing = [(f.name, flag_of(f.name)) for f in dataclasses.fields(JobSpec)
               if f.name not in ELSEWHERE and flag_of(f.name) not in train]
    assert not missing, f"JobSpec fields without a `flextrain train` flag of their name: {missing}"


def test_fields_set_by_other_commands_are_their_flags():
    assert {"--checkpoint", "--prediction-data", "--output"} <= options("predict")
    assert "--checkpoint" in options("evaluate")
