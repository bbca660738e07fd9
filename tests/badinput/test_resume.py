"""Resume means what it says: changeable settings are applied and recorded, others refused by name,
and a moved or copied job directory resumes from its own state.

Refusals run in-process (``flextrain.cli.main``) on a stored jobspec.json: they happen before
anything is read beyond it or written. One real finished job (the counting model, 1 worker) is
copied elsewhere and resumed with more epochs, a new learning rate and validation data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flextrain.cli import given_flags, main, make_parser, resume_spec
from flextrain.elastic.statecodec import decode
from flextrain.job import SETTINGS, JobSpec, Strategy
from flextrain.master.resume import (CHANGEABLE, ResumeSpecError, read_history, reroot, reroot_ledger,
                                     resumed_spec)
from ft_helpers import COUNTING_MODEL, counting_data, flextrain_cmd, read_status, seen_counts


def stored_job(job_dir: Path, **fields) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    spec = JobSpec.of(**{"name": "job", "model_def": "m.py:Model", "training_data": "/data/train",
                         "job_dir": str(job_dir), "epochs": 3, **fields})
    (job_dir / "jobspec.json").write_text(spec.to_json() + "\n")
    return job_dir


def test_given_flags_are_told_from_defaults():
    parser = make_parser()
    argv = ["--log-level", "INFO", "train", "--resume", "jobs/a", "--epochs", "1", "--lr", "0.5", "--no-preflight"]
    args = parser.parse_args(argv)
    # --epochs 1 equals the default and is still given; --seed (default 0) is not
    assert given_flags(parser, argv, args) == {"resume", "epochs", "learning_rate", "no_preflight"}


@pytest.mark.parametrize("flags, named", [
    (["--global-batch-size", "32"], ["--global-batch-size"]),
    (["--seed", "7", "--shuffle", "--steps-per-task", "4"], ["--seed", "--shuffle", "--steps-per-task"]),
    (["--seed", "0", "--global-batch-size", "32"], ["--global-batch-size"]),  # --seed 0: the job's own
    (["--training-data", "/elsewhere", "--model-def", "n.py:Model"], ["--model-def", "--training-data"]),
    (["--job-dir", "/tmp/x"], ["--job-dir"]),
    (["--image", "me/flextrain:1"], ["--image"]),
])
def test_a_setting_that_cannot_change_is_refused_by_name(capsys, tmp_path, flags, named):
    job_dir = stored_job(tmp_path / "job")
    before = (job_dir / "jobspec.json").read_bytes()
    assert main(["train", "--resume", str(job_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flextrain: error: ") and err.count("\n") == 1, err
    assert f"{', '.join(named)} cannot change on --resume" in err, err
    assert "--epochs" in err.split("A resume may change:")[1]  # and it says what may change
    assert (job_dir / "jobspec.json").read_bytes() == before and sorted(os.listdir(job_dir)) == ["jobspec.json"]


def test_the_docs_list_every_setting_a_resume_may_change():
    from flextrain.master.resume import flag_of

    doc = (Path(__file__).resolve().parents[2] / "docs" / "running-jobs.md").read_text()
    table = doc[doc.index("| may change on `--resume` |"):doc.index("Any other flag given with `--resume`")]
    key = {s.path: s.key for s in SETTINGS}
    missing = [flag_of(key[path]) for path in CHANGEABLE if f"`{flag_of(key[path])}`" not in table]
    assert not missing, f"docs/running-jobs.md's resume table lacks {missing}"


def test_the_jobs_own_values_given_again_are_no_change(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("")
    monkeypatch.chdir(tmp_path)  # the command line run again from where it was: relative paths as given then
    job_dir = stored_job(tmp_path / "job", model_def=f"{tmp_path / 'm.py'}:Model", training_data=str(tmp_path / "d"))
    parser = make_parser()
    argv = ["train", "--resume", str(job_dir), "--model-def", "m.py:Model", "--training-data", "d",
            "--global-batch-size", "64", "--seed", "0", "--epochs", "4"]
    args = parser.parse_args(argv)
    args.given = given_flags(parser, argv, args)
    resumed = resume_spec(args)
    assert resumed.changes == ("--epochs 3 -> 4",)
    assert resumed.spec.training.global_batch_size == 64 and resumed.spec.data.training == str(tmp_path / "d")


def test_fewer_epochs_and_a_parameter_server_lr_are_refused(capsys, tmp_path):
    job_dir = stored_job(tmp_path / "job")
    assert main(["train", "--resume", str(job_dir), "--epochs", "2"]) == 2
    assert "--epochs 2 is fewer than the job's 3: a resume may extend training, not shorten it" in \
        capsys.readouterr().err
    ps_dir = stored_job(tmp_path / "ps", strategy=Strategy.PARAMETER_SERVER, ps=1)
    with pytest.raises(ResumeSpecError, match="--lr cannot change on --resume of a ParameterServer job"):
        resumed_spec(ps_dir, {"learning_rate": 0.5})


def test_a_directory_without_a_job_is_named(capsys, tmp_path):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert f"{tmp_path / 'jobspec.json'} not found (not a flextrain job directory)" in capsys.readouterr().err
    (tmp_path / "jobspec.json").write_text("{truncated")
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert f"{tmp_path / 'jobspec.json'} is damaged" in capsys.readouterr().err


def test_changes_are_applied_and_a_moved_directory_is_rerooted(tmp_path):
    old = "/old/place/job"
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data=f"{old}/data,/shared/more", job_dir=old,
                   validation_data=f"{old}/validation", epochs=3)
    (job_dir / "jobspec.json").write_text(spec.to_json())
    resumed = resumed_spec(job_dir, {"epochs": 5, "learning_rate": 0.5, "workers": 1, "preflight": False})
    root = str(job_dir.resolve())
    assert resumed.moved_from == old and resumed.spec.job_dir == root
    assert resumed.spec.data.training == f"{root}/data,/shared/more"  # what lay outside stays where it is
    assert resumed.spec.data.validation == f"{root}/validation"
    assert (resumed.spec.training.epochs, resumed.spec.training.learning_rate, resumed.spec.training.preflight) == (5, 0.5, False)
    # --workers 1 is the stored value: no change to record
    assert resumed.changes == ("--epochs 3 -> 5", "--lr (unset) -> 0.5", "--no-preflight")
    assert set(CHANGEABLE) < {s.path for s in SETTINGS}


def test_ledger_sources_under_a_moved_directory_follow_it():
    assert reroot("/a/job/data/x.rio", "/a/job", "/b/j") == "/b/j/data/x.rio"
    assert reroot("/a/jobs/x.rio", "/a/job", "/b/j") == "/a/jobs/x.rio"  # a sibling, not under it
    state = {"epoch": 0, "todo": [{"source": "/a/job/d.rio", "start": 0}, {"source": "/data/e.rio", "start": 0}]}
    assert [t["source"] for t in reroot_ledger(state, "/a/job", "/b/j")["todo"]] == ["/b/j/d.rio", "/data/e.rio"]


# ---- end to end ----------------------------------------------------------------------------
G, RECORDS = 32, 256
ENV = {**os.environ, "FT_COUNT_G": str(G), "PYTHONUNBUFFERED": "1"}


def counting_train(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(flextrain_cmd("train", *args, "--no-preflight", "--no-progress"), capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.e2e
def test_a_copied_finished_job_trains_more_epochs_from_its_own_state(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data", records=RECORDS)
    original = tmp_path / "original"
    first = counting_train("--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size",
                           str(G), "--max-micro-batch", "16", "--lr", "0.05", "--job-dir", str(original),
                           "--workers", "1", "--epochs", "1")
    assert first.returncode == 0, first.stderr
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(original, copy)
    before = snapshot(original)

    again = counting_train("--resume", str(copy))  # nothing left to train: said, with how to train more
    assert again.returncode == 2, again.stderr
    assert "already finished training its 1 epoch(s)" in again.stderr and "--epochs N" in again.stderr

    resumed = counting_train("--resume", str(copy), "--epochs", "2", "--lr", "0.01",
                             "--validation-data", str(digits_data / "validation"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"{copy} was recorded at {original}: resuming from its own state here" in resumed.stderr
    status = read_status(copy)
    assert status["phase"] == "Succeeded" and status["jobDir"] == str(copy)
    assert any(e.startswith("resumed with --epochs 1 -> 2; --lr 0.05 -> 0.01; --validation-data (unset) -> ")
               for e in status["events"]), status["events"]
    assert status["evaluations"] and "accuracy" in status["metrics"]  # the validation data given was used
    seen, version = seen_counts(copy)
    assert version == 2 * RECORDS // G
    assert seen[:RECORDS].min().item() == seen[:RECORDS].max().item() == 2  # every record once per epoch
    state = decode((copy / "checkpoints" / "final.ckpt").read_bytes())
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.01  # the new learning rate was applied
    stored = json.loads((copy / "jobspec.json").read_text())
    assert (stored["training"]["epochs"], stored["training"]["learning_rate"], stored["job_dir"]) == (2, 0.01, str(copy))
    runs = read_history(copy)
    assert [r["run"] for r in runs] == ["start", "resume"]  # the refused resume left no trace
    assert runs[-1]["movedFrom"] == str(original) and runs[-1]["changes"][0] == "--epochs 1 -> 2"
    assert snapshot(original) == before  # the job at the recorded location was neither resumed nor touched


@pytest.mark.parametrize("keep_lr, expected", [(True, 0.01), (False, 0.05)])
def test_a_given_learning_rate_outlives_the_loaded_optimizer_state(keep_lr, expected):
    import torch

    from flextrain.worker.frameworks import make_backend
    from flextrain.worker.module import load_model_def

    model_def = load_model_def(COUNTING_MODEL)
    old = model_def.model_fn()
    saved = make_backend(model_def=model_def, model=old, optimizer=model_def.optimizer(old.parameters(), lr=0.05),
                         extra=0).state()
    model = model_def.model_fn()
    backend = make_backend(model_def=model_def, model=model, optimizer=model_def.optimizer(model.parameters(), lr=0.01),
                           extra=0, keep_lr=keep_lr)
    backend.load_state(saved)
    # the module's own groups keep their own rates: the counter's 0.0 is not overwritten with --lr
    assert [g["lr"] for g in backend.optimizer.param_groups] == [expected, 0.0]
    assert torch.equal(backend.model.state_dict()["seen"], saved["model"]["seen"])


@pytest.mark.e2e
def test_a_job_failed_on_a_bad_task_resumes_and_trains_the_tasks_records(digits_data, tmp_path):
    """A task that fails past its retries fails the job, but its records stay owed in the ledger saved
    with the failure: a --resume once the data is repaired trains them, every record once."""
    from flextrain.data import RecordIOReader, read_records, write_records

    data = tmp_path / "data"
    data.mkdir()
    path = data / "part-0.rio"
    source = sorted((digits_data / "train").glob("*.rio"))[0]
    write_records(path, read_records(source)[:RECORDS], max_chunk_size=65 * G)  # G records a chunk
    good = path.read_bytes()
    bad = RecordIOReader(path).chunks[5]  # records [160, 192): the second step of the third task
    raw = bytearray(good)
    raw[bad.offset + 20 + 100] ^= 0xFF  # a payload byte: the chunk's CRC no longer matches
    path.write_bytes(bytes(raw))
    job_dir = tmp_path / "job"
    failed = counting_train("--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size",
                            str(G), "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "1", "--epochs", "1",
                            "--steps-per-task", "2", "--max-task-retries", "1")
    assert failed.returncode == 6, failed.stderr  # ExitCode.DATA
    status = read_status(job_dir)
    assert status["phase"] == "Failed" and "records [160, 192)" in status["message"], status["message"]

    path.write_bytes(good)  # the user repairs the file
    resumed = counting_train("--resume", str(job_dir))
    assert resumed.returncode == 0, resumed.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded" and status["progress"]["recordsDone"] == RECORDS, status["progress"]
    seen, version = seen_counts(job_dir)
    assert version == RECORDS // G
    counts = seen[:RECORDS].tolist()
    assert [i for i, c in enumerate(counts) if c != 1] == []  # none skipped, none twice


def test_a_finished_job_with_validation_data_is_told_how_to_evaluate_its_final_model():
    from flextrain.master.jobdir import finished_message

    told = finished_message("/j", 2, "/j/checkpoints/final.ckpt", model_def="/m.py:Model", validation="/v")
    assert told == ("/j already finished training its 2 epoch(s) (final checkpoint /j/checkpoints/final.ckpt); "
                    "`flextrain train --resume /j --epochs N` with N > 2 trains more; `flextrain evaluate "
                    "--checkpoint /j --model-def /m.py:Model --validation-data /v` evaluates its final model")
    assert "evaluate" not in finished_message("/j", 2, "/j/checkpoints/final.ckpt", model_def="/m.py:Model")
