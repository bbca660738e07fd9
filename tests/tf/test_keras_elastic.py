"""A Keras job survives a killed worker and takes in its replacement, in-process.

The round protocol is the framework-neutral one (``flextrain/worker/trainer.py``;
its exactly-once accounting is proven with the counting model in
``tests/e2e/test_elastic.py``); here the Keras backend's part is exercised: the
survivor keeps its process and its Keras state, and the replacement receives
model and optimizer state by broadcast before its first step.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from ft_helpers import MODEL_ZOO, flextrain_cmd, read_status, wait_for

pytestmark = pytest.mark.e2e

TRAIN_RECORDS = 1438


def _status(job_dir):
    return read_status(job_dir) if (job_dir / "status.json").exists() else None


def test_keras_worker_killed_survivor_continues_and_replacement_joins(digits_examples, tmp_path):
    job_dir = tmp_path / "job"
    # The survivor alone must not finish before the replacement joins: forked with TensorFlow loaded it takes
    # ~2 s (flextrain/zygote.py's preload), and the 16 epochs' ~370 steps leave it over half a minute
    epochs = 16
    proc = subprocess.Popen(flextrain_cmd(
        "train", "--model-def", f"{MODEL_ZOO / 'digits_keras.py'}:custom_model",
        "--training-data", str(digits_examples / "train"), "--validation-data", str(digits_examples / "validation"),
        "--workers", "2", "--min-workers", "1", "--max-workers", "2", "--epochs", str(epochs),
        "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1", "--job-dir", str(job_dir),
        "--no-progress"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "FLEXTRAIN_LOG_LEVEL": "INFO"})
    try:
        first = wait_for(lambda: (s := _status(job_dir)) and s["roundHistory"] and s["step"] > 20
                         and len(s["roundHistory"][-1]["members"]) == 2 and s["roundHistory"][-1],
                         timeout=240, what="two Keras workers training")
        victim, survivor = first["members"]
        os.kill(victim["pid"], signal.SIGKILL)

        def later_rounds():
            return [r for r in _status(job_dir)["roundHistory"] if r["round"] > first["round"]]
        alone = wait_for(lambda: [r for r in later_rounds() if len(r["members"]) == 1], timeout=60,
                         what="the survivor's own round")[0]
        assert alone["members"] == [survivor]  # same id, same pid: no restart
        assert alone["version"] > first["version"]
        both = wait_for(lambda: [r for r in later_rounds() if len(r["members"]) == 2], timeout=180,
                        what="the replacement joining")[0]
        assert survivor in both["members"] and victim["id"] not in {m["id"] for m in both["members"]}
        _, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == epochs * TRAIN_RECORDS
    assert status["step"] == epochs * -(-TRAIN_RECORDS // 64)  # the global batch stayed 64 throughout
    # the newcomer trained from the broadcast state: the final model (rank 0 of the last round) is good
    assert status["metrics"]["accuracy"] > 0.90, status["metrics"]
    # Every worker traced its two step functions once, before it registered (GetJobSpecResponse.sample):
    # neither the replacement's first step, nor the rounds of 1 and 2 workers, nor an epoch's short last
    # step (1438 = 22 * 64 + 30 records) waited on a trace. The victim was killed before its last lines.
    finished = {p.name: p.read_text() for p in (job_dir / "logs").glob("worker-*.log")
                if "training tasks:" in p.read_text()}
    assert len(finished) == 2, sorted(finished)
    for name, text in finished.items():
        assert "the step's functions were traced 2 times" in text, (name, text[-2000:])
