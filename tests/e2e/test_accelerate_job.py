"""``flextrain train --accelerate`` in real jobs (docs/accelerate.md, "In jobs"): the workers apply the strategy
to the module's model, every record is applied exactly once and the model still learns; with ``auto`` one
worker searches, the master keeps its choice in <job dir>/accelerate/strategy.json, and the other workers
and a resumed job's workers apply it without searching.

The module is tests/e2e/zoo/counting_digits.py: each record's applications are counted in the model's own
state (``seen``), so the final checkpoint shows that every record was applied once per epoch.
"""

from __future__ import annotations

import json
import re

import pytest

from ft_helpers import COUNTING_MODEL, counting_data, read_status, run_flextrain, seen_counts

pytestmark = pytest.mark.e2e

RECORDS, G = 640, 32
ENV = {"FT_COUNT_RECORDS": str(RECORDS), "FT_COUNT_G": str(G), "FLEXTRAIN_LOG_LEVEL": "INFO"}


@pytest.fixture(scope="module")
def data(digits_data, tmp_path_factory):
    return counting_data(digits_data, tmp_path_factory.mktemp("accelerate") / "data", records=RECORDS)


def train(job_dir, data, digits_data, accelerate: str, *extra: str, epochs: int = 2, env: dict | None = None):
    return run_flextrain("train", "--model-def", COUNTING_MODEL, "--training-data", str(data),
                         "--validation-data", str(digits_data / "validation"), "--evaluation-steps", "20",
                         "--workers", "2", "--global-batch-size", str(G), "--max-micro-batch", "12",
                         "--epochs", str(epochs), "--accelerate", accelerate, "--no-progress",
                         "--job-dir", str(job_dir), *extra, env_extra={**ENV, **(env or {})})


def logs(job_dir) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted((job_dir / "logs").glob("worker-*.log"))}


def assert_trained_exactly_once(job_dir, epochs: int) -> dict:
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded", status["message"]
    seen, version = seen_counts(job_dir)
    assert seen.tolist() == [float(epochs)] * RECORDS  # every record once per epoch, none lost or repeated
    assert version == epochs * RECORDS // G  # the global batch held: RECORDS/G steps an epoch
    accuracy = [e["metrics"]["accuracy"] for e in status["evaluations"]]  # this run's (a resume's: its own)
    assert accuracy[-1] >= 0.8 and (len(accuracy) == 1 or accuracy[-1] > accuracy[0]), accuracy  # it learns
    return status


def test_amp_bf16_trains_every_record_once(data, digits_data, tmp_path):
    job_dir = tmp_path / "job"
    proc = train(job_dir, data, digits_data, "amp_native:bf16", epochs=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = assert_trained_exactly_once(job_dir, 3)
    assert status["accelerate"]["strategy"] == "amp_native:bf16"
    assert status["accelerate"]["source"] == "given (--accelerate)"
    for worker, text in logs(job_dir).items():
        assert "accelerate: applying amp_native:bf16 (given by --accelerate)" in text, worker


def test_conv_methods_and_a_compiled_model_train_every_record_once(data, digits_data, tmp_path):
    """channels_last and checkpoint on a conv net, compiled: rank 0's compiled model reaches rank 1 by the
    round's broadcast, and the checkpoints hold the plain model's keys."""
    job_dir = tmp_path / "job"
    proc = train(job_dir, data, digits_data, "channels_last,checkpoint:Conv2d,compile:eager",
                 env={"FT_COUNT_ARCH": "conv"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = assert_trained_exactly_once(job_dir, 2)
    assert status["accelerate"]["strategy"] == "channels_last, checkpoint:Conv2d, native_dynamo:eager"
    for worker, text in logs(job_dir).items():
        assert ("accelerate: applying channels_last, checkpoint:Conv2d, native_dynamo:eager (given by --accelerate); "
                "checkpoint: 1 module(s) recompute their forward") in text, worker
    from flextrain.elastic.statecodec import decode

    keys = list(decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())["model"])
    assert keys == ["seen", "net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"]


def test_auto_searches_once_and_every_worker_and_a_resume_reuse_the_choice(data, digits_data, tmp_path):
    job_dir = tmp_path / "job"
    first = train(job_dir, data, digits_data, "auto", epochs=1)
    assert first.returncode == 0, first.stderr[-3000:]
    status = read_status(job_dir)
    shown = status["accelerate"]
    searcher = shown["search"]["worker"]
    assert shown["setting"] == "auto" and shown["source"] == f"searched by {searcher}"
    kept = job_dir / "accelerate" / "strategy.json"
    from flextrain.accelerate import Strategy
    from flextrain.accelerate.jobs import describe

    assert describe(Strategy.load(kept)) == shown["strategy"] == shown["search"]["chosen"]
    assert json.loads((job_dir / "accelerate" / "search.json").read_text())["worker"] == searcher
    first_logs = logs(job_dir)
    searched = [w for w, text in first_logs.items() if "accelerate: searched" in text]
    assert searched == [searcher] and first_logs[searcher].count("accelerate: searched") == 1
    for worker, text in first_logs.items():
        applied = f"accelerate: applying {shown['strategy']} (searched by {searcher}"
        assert applied + (")" if worker == searcher else "; not searching again)") in text, worker
    assert sum("searches for the job's training strategy" in e for e in status["events"]) == 1

    resumed = run_flextrain("train", "--resume", str(job_dir), "--epochs", "2", "--no-progress", env_extra=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    status = assert_trained_exactly_once(job_dir, 2)
    assert status["accelerate"]["source"].startswith(f"stored in {kept}")
    assert not any("searches for the job's training strategy" in e for e in status["events"])
    for worker, text in logs(job_dir).items():  # both runs' output: the resumed workers append to it
        assert text.count("accelerate: searched") == (1 if worker == searcher else 0), worker
        assert re.search(rf"accelerate: applying {re.escape(shown['strategy'])} \(stored in {re.escape(str(kept))}"
                         rf", searched by {searcher}; not searching again\)", text), worker
    assert describe(Strategy.load(kept)) == shown["strategy"]  # unchanged
