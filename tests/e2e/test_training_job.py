"""Real jobs: `flextrain train` as a process, real workers, gRPC and gloo on loopback."""

from __future__ import annotations

import re

import pytest
import torch

from ft_helpers import DIGITS_MODEL, read_status, run_flextrain
from flextrain.data import read_records
from flextrain.elastic.statecodec import decode

pytestmark = pytest.mark.e2e


def test_two_workers_train_digits_above_90_percent(digits_fixed_g):
    job_dir, proc = digits_fixed_g
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 6 * 1438
    assert status["progress"]["percent"] == 100.0
    assert status["metrics"]["accuracy"] > 0.90
    # the last reported training loss (a mean over the final steps) is far below chance, ln(10) = 2.30
    assert 0 < status["metrics"]["loss"] < 1.0
    assert status["step"] == 6 * -(-1438 // 64)
    assert "accuracy" in proc.stderr  # the closing summary names the metric
    # both workers took part and logged their round
    logs = sorted((job_dir / "logs").glob("worker-*.log"))
    assert [p.name for p in logs] == ["worker-0.log", "worker-1.log"]
    # with no read-ahead thread, each worker read and fed every step but a task's first while the
    # step before it was being summed; every step was loaded once
    for log in logs:
        loaded = re.search(r"records of (\d+) steps were read ahead, (\d+) on the spot \(read-ahead thread: off\)",
                           log.read_text())
        assert loaded, log.read_text()[-2000:]
        ahead, now = int(loaded[1]), int(loaded[2])
        assert ahead + now == status["step"] and ahead > now


def _reference_run(train_dir, *, seed, global_batch, epochs, lr):
    """A single-process PyTorch loop over the same records, same global batch, same seed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("digits_ref", DIGITS_MODEL.split(":")[0])
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    torch.manual_seed(seed)
    model = zoo.Model()
    opt = zoo.optimizer(model.parameters(), lr=lr)
    records = [r for f in sorted(train_dir.glob("*.rio")) for r in read_records(f)]
    x, y = zoo.feed(records, "training", None)
    for _ in range(epochs):
        for lo in range(0, len(records), global_batch):
            opt.zero_grad()
            zoo.loss(y[lo : lo + global_batch], model(x[lo : lo + global_batch])).backward()
            opt.step()
    return model.state_dict()


def test_distributed_step_equals_single_process_step(digits_data, tmp_path):
    """Two workers with uneven micro-batches and accumulation = one process with batch G."""
    job_dir = tmp_path / "job"
    # G=50 over 2 workers with M=16: k=2, four micro-batches of 13/13/12/12.
    proc = run_flextrain(
        "train", "--model-def", DIGITS_MODEL, "--training-data", str(digits_data / "train"),
        "--workers", "2", "--epochs", "2", "--global-batch-size", "50", "--max-micro-batch", "16",
        "--lr", "0.05", "--seed", "7", "--job-dir", str(job_dir),
    )
    assert proc.returncode == 0, proc.stderr
    final = decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())
    assert final["version"] == 2 * -(-1438 // 50)
    expected = _reference_run(digits_data / "train", seed=7, global_batch=50, epochs=2, lr=0.05)
    for name, tensor in expected.items():
        torch.testing.assert_close(final["model"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
