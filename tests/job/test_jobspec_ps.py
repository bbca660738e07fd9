"""JobSpec and CLI settings of the ParameterServer strategy."""

from __future__ import annotations

import pytest

from flextrain.cli import build_spec, make_parser
from flextrain.job import JobSpec, JobSpecError, Strategy


def spec(**changes) -> JobSpec:
    return JobSpec(name="ctr", model_def="m.py:Model", training_data="/d", job_dir="/tmp/jobs/ctr").replace(**changes)


def test_allreduce_stays_the_default():
    s = spec().validate()
    assert s.strategy is Strategy.ALLREDUCE and s.ps == 0 and s.ps_mode == "sync"


def test_parameter_server_spec_roundtrips():
    s = spec(strategy=Strategy.PARAMETER_SERVER, ps=2, ps_mode="async", grads_to_wait=2).validate()
    assert JobSpec.from_json(s.to_json()) == s
    assert s.effective_grads_to_wait == 2 and s.ps_checkpoint_dir.as_posix() == "/tmp/jobs/ctr/ps-checkpoints"
    assert spec().effective_grads_to_wait == 1


@pytest.mark.parametrize("changes, needle", [
    (dict(strategy=Strategy.PARAMETER_SERVER), "--distribution-strategy ParameterServer needs --ps N"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=-1), "needs --ps N"),
    (dict(ps=2), "--ps 2 needs --distribution-strategy ParameterServer"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=1, ps_mode="bsp"), "--ps-mode must be 'sync' or 'async'"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=1, grads_to_wait=0), "--grads-to-wait must be a positive"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=1, ps_checkpoint_steps=-1), "--ps-checkpoint-steps must be"),
])
def test_bad_ps_settings_name_the_flag(changes, needle):
    with pytest.raises(JobSpecError, match=needle):
        spec(**changes).validate()


def test_cli_flags_build_a_ps_spec(tmp_path):
    args = make_parser().parse_args([
        "train", "--model-def", "m.py:Model", "--training-data", str(tmp_path), "--job-dir", str(tmp_path / "j"),
        "--distribution-strategy", "ParameterServer", "--ps", "2", "--workers", "2", "--ps-mode", "async",
        "--grads-to-wait", "2", "--ps-checkpoint-steps", "5"])
    s = build_spec(args).validate()
    assert (s.strategy, s.ps, s.workers, s.ps_mode, s.grads_to_wait, s.ps_checkpoint_steps) == \
        (Strategy.PARAMETER_SERVER, 2, 2, "async", 2, 5)


def test_ps_subcommand_passes_its_flags_to_the_ps(monkeypatch):
    import flextrain.ps.main as ps_main
    from flextrain import cli

    seen = []
    monkeypatch.setattr(ps_main, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["ps", "--shard-index", "1", "--num-ps", "2", "--port", "0"]) == 0
    assert seen == [["--shard-index", "1", "--num-ps", "2", "--port", "0"]]


def test_resume_of_a_ps_job_is_refused(tmp_path):
    from flextrain.master.main import ResumeError, run_master

    s = spec(strategy=Strategy.PARAMETER_SERVER, ps=1, job_dir=str(tmp_path)).validate()
    with pytest.raises(ResumeError, match="not supported for ParameterServer"):
        run_master(s, resume=True)
    assert not (tmp_path / "jobspec.json").exists()
