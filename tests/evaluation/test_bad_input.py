"""`flextrain evaluate` / `predict` / `train --evaluation-steps` reject bad input before anything starts."""

from __future__ import annotations

import pytest

from evalcases import STEPCOUNT, stepcount_checkpoint, write_csv
from flextrain.cli import main


def run(capsys, *args):
    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.fixture
def ckpt(tmp_path):
    return stepcount_checkpoint(tmp_path / "model.ckpt", version=2)


def test_missing_checkpoint(capsys, tmp_path, validation):
    code, err = run(capsys, "evaluate", "--model-def", STEPCOUNT, "--validation-data", str(validation),
                    "--checkpoint", str(tmp_path / "nope.ckpt"), "--job-dir", str(tmp_path / "job"))
    assert code == 2
    assert f"--checkpoint {tmp_path / 'nope.ckpt'}: no such file or directory" in err
    assert not (tmp_path / "job").exists()  # nothing started


def test_job_directory_without_checkpoint(capsys, tmp_path, validation):
    (tmp_path / "empty-job").mkdir()
    code, err = run(capsys, "evaluate", "--model-def", STEPCOUNT, "--validation-data", str(validation),
                    "--checkpoint", str(tmp_path / "empty-job"), "--job-dir", str(tmp_path / "job"))
    assert code == 2 and "a directory without a checkpoint" in err


def test_data_the_module_cannot_feed_is_refused_before_any_worker_starts(capsys, tmp_path, ckpt):
    (tmp_path / "two.csv").write_text("x,1\ny,0\n")  # the module's feed reads a number first
    code, err = run(capsys, "evaluate", "--model-def", STEPCOUNT, "--validation-data", str(tmp_path / "two.csv"),
                    "--checkpoint", str(ckpt), "--job-dir", str(tmp_path / "job"))
    assert code == 2 and "evaluation of the first validation records (feed in 'evaluation' mode" in err, err
    assert "raised ValueError: could not convert string to float: 'x'" in err and "stepcount.py:59" in err, err
    assert not (tmp_path / "job").exists()  # the workers would have failed it task by task, after retries


def test_a_parameter_server_job_without_a_readable_shard_is_refused_naming_it(capsys, tmp_path, validation):
    (tmp_path / "ps-job" / "ps-checkpoints" / "ps-0").mkdir(parents=True)
    code, err = run(capsys, "evaluate", "--model-def", STEPCOUNT, "--validation-data", str(validation),
                    "--checkpoint", str(tmp_path / "ps-job"), "--job-dir", str(tmp_path / "job"))
    assert code == 2, err
    assert "ps-checkpoints/ps-0: no readable checkpoint or write-ahead log: the shard holds no model" in err, err
    assert not (tmp_path / "job").exists()  # the export's file and the directory it made are gone


def test_checkpoint_that_is_not_a_flextrain_checkpoint(capsys, tmp_path, validation):
    bogus = tmp_path / "bogus.ckpt"
    bogus.write_bytes(b"PK\x03\x04 a torch.save zip, say")
    code, err = run(capsys, "evaluate", "--model-def", STEPCOUNT, "--validation-data", str(validation),
                    "--checkpoint", str(bogus), "--job-dir", str(tmp_path / "job"))
    assert code == 2
    assert err == (f"flextrain: error: --checkpoint {bogus}: not a flextrain checkpoint (its first bytes are "
                   "b'PK\\x03\\x04', a checkpoint's b'FTST'); give a checkpoint file (checkpoints/*.ckpt) or a job "
                   "directory (its final or latest checkpoint)\n")
    assert not (tmp_path / "job").exists()  # refused before anything started


def test_checkpoint_of_another_model(capsys, tmp_path, validation, ckpt):
    from ft_helpers import DIGITS_MODEL

    code, err = run(capsys, "predict", "--model-def", DIGITS_MODEL, "--prediction-data", str(validation),
                    "--checkpoint", str(ckpt), "--output", str(tmp_path / "out"), "--job-dir", str(tmp_path / "j"))
    assert code == 2 and f"checkpoint {ckpt} does not fit the model" in err and "Missing key" in err


def test_module_without_eval_metrics_fn(capsys, tmp_path, validation, ckpt):
    module = tmp_path / "nometrics.py"
    source = (STEPCOUNT.split(":")[0])
    text = open(source).read().replace("def eval_metrics_fn", "def _not_eval_metrics_fn")
    module.write_text(text)
    code, err = run(capsys, "evaluate", "--model-def", f"{module}:Model", "--validation-data", str(validation),
                    "--checkpoint", str(ckpt), "--job-dir", str(tmp_path / "job"))
    assert code == 2
    assert f"{module} defines no `eval_metrics_fn`" in err and "flextrain evaluate" in err


def test_prediction_data_the_module_cannot_feed_is_refused_before_any_worker_starts(capsys, tmp_path, ckpt):
    (tmp_path / "two.csv").write_text("x,1\ny,0\n")
    out = tmp_path / "out"
    code, err = run(capsys, "predict", "--model-def", STEPCOUNT, "--prediction-data", str(tmp_path / "two.csv"),
                    "--checkpoint", str(ckpt), "--output", str(out), "--job-dir", str(tmp_path / "job"))
    assert code == 2 and "prediction of the first records (feed in 'prediction' mode" in err, err
    assert f"on {tmp_path / 'two.csv'} records [0, 2)" in err, err
    assert "raised ValueError: could not convert string to float: 'x'" in err and "stepcount.py:59" in err, err
    assert not (tmp_path / "job").exists() and not out.exists()


def test_prediction_data_missing(capsys, tmp_path, ckpt):
    code, err = run(capsys, "predict", "--model-def", STEPCOUNT, "--prediction-data", str(tmp_path / "nodata"),
                    "--checkpoint", str(ckpt), "--output", str(tmp_path / "out"), "--job-dir", str(tmp_path / "j"))
    assert code == 2
    assert "prediction data" in err and str(tmp_path / "nodata") in err
    assert not (tmp_path / "out").exists()


def test_output_that_already_holds_predictions(capsys, tmp_path, validation, ckpt):
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-000000.jsonl").write_text("{}\n")
    code, err = run(capsys, "predict", "--model-def", STEPCOUNT, "--prediction-data", str(validation),
                    "--checkpoint", str(ckpt), "--output", str(out), "--job-dir", str(tmp_path / "j"))
    assert code == 2 and f"--output {out} already holds predictions" in err


def test_required_flags_are_named(capsys, tmp_path, ckpt):
    with pytest.raises(SystemExit) as exc:
        main(["predict", "--model-def", STEPCOUNT, "--checkpoint", str(ckpt), "--output", str(tmp_path)])
    assert exc.value.code == 2
    assert "--prediction-data" in capsys.readouterr().err


def test_evaluation_steps_need_validation_data(capsys, tmp_path):
    train = write_csv(tmp_path / "train" / "a.csv", range(10))
    code, err = run(capsys, "train", "--model-def", STEPCOUNT, "--training-data", str(train.parent),
                    "--evaluation-steps", "5", "--job-dir", str(tmp_path / "job"))
    assert code == 2 and "--evaluation-steps 5 needs --validation-data" in err


def test_negative_evaluation_steps(capsys, tmp_path, validation):
    train = write_csv(tmp_path / "train" / "a.csv", range(10))
    code, err = run(capsys, "train", "--model-def", STEPCOUNT, "--training-data", str(train.parent),
                    "--validation-data", str(validation), "--evaluation-steps", "-1", "--job-dir", str(tmp_path / "j"))
    assert code == 2 and "--evaluation-steps must be an integer >= 0, got -1" in err


def test_status_summary_names_the_latest_evaluation(capsys, tmp_path):
    import json

    job = tmp_path / "job"
    job.mkdir()
    (job / "status.json").write_text(json.dumps({
        "name": "j", "jobDir": str(job), "phase": "Succeeded", "message": "", "pid": 0,
        "workers": {"active": 0, "desired": 2}, "epoch": 1, "epochs": 1, "step": 20,
        "progress": {"recordsDone": 640, "recordsTotal": 640, "percent": 100.0},
        "metrics": {"accuracy": 0.8, "loss": 0.5},
        "evaluations": [{"step": 10, "metrics": {"accuracy": 0.7}, "samples": 100},
                        {"step": 20, "metrics": {"accuracy": 0.8}, "samples": 100}]}))
    assert main(["status", str(job)]) == 0
    out = capsys.readouterr().out
    assert "accuracy  0.8000" in out and "evaluated at step 20 on 100 samples (of 2 evaluations)" in out
