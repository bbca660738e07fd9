"""`flextrain predict`: one row per input record, in input order, values of a local forward pass."""

from __future__ import annotations

import json

import pytest
import torch

from evalcases import STEPCOUNT, stepcount_checkpoint, write_csv
from ft_helpers import DIGITS_MODEL, read_status, run_flextrain
from flextrain.data import read_records
from flextrain.data.predictions import MANIFEST, read_predictions
from flextrain.elastic.statecodec import decode

pytestmark = pytest.mark.e2e


def test_predictions_of_a_trained_digits_model_match_a_local_forward_pass(digits_data, digits_fixed_g, tmp_path):
    trained, proc = digits_fixed_g  # the session's trained digits job (tests/conftest.py)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "predictions"
    proc = run_flextrain(
        "predict", "--model-def", DIGITS_MODEL, "--prediction-data", str(digits_data / "validation"),
        "--checkpoint", str(trained), "--output", str(out), "--workers", "2", "--global-batch-size", "32",
        "--steps-per-task", "2", "--max-micro-batch", "20", "--job-dir", str(tmp_path / "predict-job"),
    )
    assert proc.returncode == 0, proc.stderr
    status = read_status(tmp_path / "predict-job")
    assert status["phase"] == "Succeeded" and "359 predictions written" in status["message"]

    sources = sorted((digits_data / "validation").glob("*.rio"))
    records = [(str(s), i, r) for s in sources for i, r in enumerate(read_records(s))]
    rows = read_predictions(out)
    assert len(rows) == len(records) == 359  # one row per input record ...
    assert [(r["source"], r["index"]) for r in rows] == [(s, i) for s, i, _ in records]  # ... in input order
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["rows"] == 359 and len(manifest["parts"]) == -(-359 // 64)
    assert all(p["end"] - p["start"] == p["rows"] for p in manifest["parts"])

    import importlib.util

    spec = importlib.util.spec_from_file_location("digits_local", DIGITS_MODEL.split(":")[0])
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    model = zoo.Model()
    model.load_state_dict(decode((trained / "checkpoints" / "final.ckpt").read_bytes())["model"])
    model.eval()
    with torch.no_grad():
        expected = model(zoo.feed([r for _, _, r in records], "prediction", None))
    got = torch.tensor([r["prediction"] for r in rows])
    assert got.shape == (359, 10)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_task_retried_after_writing_leaves_no_duplicate_rows(tmp_path, monkeypatch):
    data = tmp_path / "data"
    write_csv(data / "a.csv", range(0, 50))
    write_csv(data / "b.csv", range(100, 130))
    ckpt = stepcount_checkpoint(tmp_path / "model.ckpt", version=3)
    log = tmp_path / "processor.jsonl"
    monkeypatch.setenv("STEPCOUNT_PROCESSOR_LOG", str(log))
    monkeypatch.setenv("STEPCOUNT_PROCESSOR_FAIL_ONCE", str(tmp_path / "failed-once"))
    out = tmp_path / "out"
    proc = run_flextrain(
        "predict", "--model-def", STEPCOUNT, "--prediction-data", str(data), "--checkpoint", str(ckpt),
        "--output", str(out), "--workers", "2", "--global-batch-size", "10", "--steps-per-task", "2",
        "--job-dir", str(tmp_path / "job"),
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "failed-once").exists()  # a task did fail after writing its part
    rows = read_predictions(out)
    xs = [*range(0, 50), *range(100, 130)]
    assert [r["prediction"] for r in rows] == [[float(x), -3.0] for x in xs]
    assert [(r["source"].rsplit("/", 1)[1], r["index"]) for r in rows] == (
        [("a.csv", i) for i in range(50)] + [("b.csv", i) for i in range(30)])
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST] + [f"part-{i:06d}.jsonl" for i in range(5)]
    # PredictionOutputsProcessor saw every task's predictions, the failed one twice (at least once)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 5 + 1
    assert sorted({x for c in calls for x in c["x"]}) == [float(x) for x in xs]
    assert all(c["shape"][1] == 2 for c in calls)
