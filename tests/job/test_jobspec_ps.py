"""JobSpec and CLI settings of the ParameterServer strategy."""

from __future__ import annotations

import pytest

from flextrain.cli import build_spec, make_parser
from flextrain.job import JobSpec, JobSpecError, Strategy


def spec(**changes) -> JobSpec:
    return JobSpec.of(name="ctr", model_def="m.py:Model", training_data="/d", job_dir="/tmp/jobs/ctr").replace(**changes)


def test_allreduce_stays_the_default():
    s = spec().validate()
    assert s.strategy is Strategy.ALLREDUCE and s.ps.replicas == 0 and s.ps.ps_mode == "sync"


def test_parameter_server_spec_roundtrips():
    s = spec(strategy=Strategy.PARAMETER_SERVER, ps=2, ps_mode="sync", grads_to_wait=2).validate()
    assert JobSpec.from_json(s.to_json()) == s
    assert s.ps.effective_grads_to_wait == 2 and s.ps_checkpoint_dir.as_posix() == "/tmp/jobs/ctr/ps-checkpoints"
    assert spec().ps.effective_grads_to_wait == 1


@pytest.mark.parametrize("changes, needle", [
    (dict(strategy=Strategy.PARAMETER_SERVER), "--distribution-strategy ParameterServer needs --ps N"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=-1), "needs --ps N"),
    (dict(ps=2), "--ps 2 needs --distribution-strategy ParameterServer"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=1, ps_mode="bsp"), "--ps-mode must be 'sync' or 'async'"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=1, grads_to_wait=0), "--grads-to-wait must be a positive"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=1, ps_checkpoint_steps=-1), "--ps-checkpoint-steps must be"),
    (dict(strategy=Strategy.PARAMETER_SERVER, ps=1, ps_mode="async", grads_to_wait=3),
     "--grads-to-wait 3 applies to --ps-mode sync"),
])
def test_bad_ps_settings_name_the_flag(changes, needle):
    with pytest.raises(JobSpecError, match=needle):
        spec(**changes).validate()


def test_cli_flags_build_a_ps_spec(tmp_path):
    args = make_parser().parse_args([
        "train", "--model-def", "m.py:Model", "--training-data", str(tmp_path), "--job-dir", str(tmp_path / "j"),
        "--distribution-strategy", "ParameterServer", "--ps", "2", "--workers", "2", "--ps-mode", "sync",
        "--grads-to-wait", "2", "--ps-checkpoint-steps", "5"])
    s = build_spec(args).validate()
    assert (s.strategy, s.ps.replicas, s.worker.replicas, s.ps.ps_mode, s.ps.grads_to_wait, s.ps.ps_checkpoint_steps) == \
        (Strategy.PARAMETER_SERVER, 2, 2, "sync", 2, 5)


def test_ps_subcommand_passes_its_flags_to_the_ps(monkeypatch):
    import flextrain.ps.main as ps_main
    from flextrain import cli

    seen = []
    monkeypatch.setattr(ps_main, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["ps", "--shard-index", "1", "--num-ps", "2", "--port", "0"]) == 0
    assert seen == [["--shard-index", "1", "--num-ps", "2", "--port", "0"]]


@pytest.mark.parametrize("saved, why", [
    ('{"ledger": {"epoch": 0, "records_done": 4, "next_id": 1, "todo": []}, "training_finished": true}',
     "already finished training its 1 epoch"),
    ("{not json", "ps-ledger.json: not valid JSON"),
])
def test_resume_of_a_finished_or_unreadable_ps_job_is_refused(tmp_path, saved, why):
    from flextrain.data import write_records
    from flextrain.master.main import ResumeError, run_master

    (tmp_path / "data").mkdir()
    write_records(tmp_path / "data" / "part-0.rio", [b"x"] * 4)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "ps-ledger.json").write_text(saved)
    s = spec(strategy=Strategy.PARAMETER_SERVER, ps=1, job_dir=str(job_dir),
             training_data=str(tmp_path / "data")).validate()
    with pytest.raises(ResumeError, match=why) as err:
        run_master(s, resume=True)
    assert str(job_dir) in str(err.value)
    assert not (job_dir / "ps").exists()  # refused before any parameter server was started
