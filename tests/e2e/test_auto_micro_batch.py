"""``--max-micro-batch auto`` in real jobs (docs/running-jobs.md): each worker probes the largest micro-batch
whose training step fits ``--memory-limit``, the master gives a round the smallest of its members' probes,
a resumed job reads the probe cache, and a job that would run out of memory with a hand-set M does not
with auto.

The module is tests/e2e/zoo/wide_digits.py: the digits model with activations ``FT_WIDE`` floats wide per
sample, so a step's memory grows with the micro-batch (the plain digits model's peak is its optimizer's
step up to ~60 samples). What fits is computed here by brute force with the same step the workers probe:
the module's forward, loss, backward and optimizer step on the first records of the training data,
measured by flextrain.elastic.memory.step_peak.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from ft_helpers import counting_data, read_status, run_flextrain

pytestmark = pytest.mark.e2e

WIDE_MODEL = f"{os.path.dirname(__file__)}/zoo/wide_digits.py:Model"
G = 64
WIDTHS = {"worker-0": 1024, "worker-1": 4096}
ROUND_LINE = re.compile(r"round (\d+): rank \d+ of (\d+) at version \d+, max micro-batch (\d+)")


def step_peaks(data, width: int) -> list[int]:
    """The peak bytes of the workers' training step on 1..G of the first G training records (index m-1)."""
    import torch

    from flextrain.data import DataOptions, make_shards, read_shard_range
    from flextrain.elastic.memory import step_peak
    from flextrain.elastic.probe import training_step
    from flextrain.worker.module import load_model_def

    md = load_model_def(WIDE_MODEL)
    saved = os.environ.get("FT_WIDE")
    os.environ["FT_WIDE"] = str(width)  # read when the model is built
    try:
        model = md.build_model()
    finally:
        os.environ.pop("FT_WIDE") if saved is None else os.environ.update(FT_WIDE=saved)
    optimizer = md.build_optimizer(model, None)
    shard = make_shards(str(data), what="training data", options=DataOptions(), skipped=[])[0]
    features, labels = md.feed(read_shard_range(shard.source, shard.start, shard.start + G), "training", None)
    model.train()
    step = training_step(model, optimizer, lambda out, y: md.loss(y, out), lambda m: (features[:m], labels[:m]))
    with torch.random.fork_rng():
        return [step_peak(lambda: step(m), baseline=step.baseline_bytes).peak_bytes for m in range(1, G + 1)]


def largest_fit(peaks: list[int], limit: int) -> int:
    return max(m for m, peak in enumerate(peaks, start=1) if peak <= limit)


def worker_log(job_dir, worker: str) -> str:
    return (job_dir / "logs" / f"{worker}.log").read_text()


@pytest.fixture(scope="module")
def two_widths(digits_data, tmp_path_factory):
    """Two workers whose steps need different memory (FT_WIDE per worker) under one --memory-limit, trained
    one epoch with auto, then resumed for a second: (job dir, limit, peaks by worker, cache after run 1,
    first run, resumed run)."""
    root = tmp_path_factory.mktemp("auto-micro-batch")
    data = counting_data(digits_data, root / "data", records=640)
    peaks = {w: step_peaks(data, width) for w, width in WIDTHS.items()}
    # A limit where worker-0 fits 20 samples and worker-1 about a fifth of that: both well below G.
    limit = (peaks["worker-0"][19] + peaks["worker-0"][20]) // 2
    job_dir = root / "job"
    env = {"FT_WIDE": ",".join(f"{w}={width}" for w, width in WIDTHS.items()), "FLEXTRAIN_LOG_LEVEL": "INFO"}
    first = run_flextrain("train", "--model-def", WIDE_MODEL, "--training-data", str(data), "--workers", "2",
                          "--global-batch-size", str(G), "--max-micro-batch", "auto", "--memory-limit", str(limit),
                          "--epochs", "1", "--no-progress", "--job-dir", str(job_dir), env_extra=env)
    cache = (job_dir / "probe" / "micro_batch.json").read_text() if first.returncode == 0 else ""
    resumed = run_flextrain("train", "--resume", str(job_dir), "--epochs", "2", "--no-progress", env_extra=env) \
        if first.returncode == 0 else None
    return job_dir, limit, peaks, cache, first, resumed


def test_each_worker_probes_the_largest_micro_batch_that_fits(two_widths):
    job_dir, limit, peaks, cache, first, _ = two_widths
    assert first.returncode == 0, first.stderr[-3000:]
    probes = json.loads((job_dir / "status.json").read_text())["maxMicroBatchChoice"]["probes"]
    for worker, worker_peaks in peaks.items():
        truth, size = largest_fit(worker_peaks, limit), probes[worker]["maxMicroBatch"]
        assert worker_peaks[size - 1] <= limit and size >= 0.9 * truth, (worker, size, truth)
        assert probes[worker]["memoryLimit"] == limit
        assert f"max micro-batch {size} measured" in worker_log(job_dir, worker)
    assert probes["worker-1"]["maxMicroBatch"] < probes["worker-0"]["maxMicroBatch"] < G // 2
    # One entry per step probed (the widths differ: so do the models' buffers, and the keys), each of its size.
    entries = json.loads(cache)
    assert sorted(e["size"] for e in entries.values()) == sorted(p["maxMicroBatch"] for p in probes.values())
    assert {e["limit"] for e in entries.values()} == {limit}


def test_every_round_plans_with_the_smallest_probe(two_widths):
    job_dir, _, _, _, first, _ = two_widths
    assert first.returncode == 0, first.stderr[-3000:]
    status = read_status(job_dir)
    probes = status["maxMicroBatchChoice"]["probes"]
    smallest = min(p["maxMicroBatch"] for p in probes.values())
    assert status["maxMicroBatchChoice"]["setting"] == "auto" and status["maxMicroBatch"] == smallest
    assert {r["maxMicroBatch"] for r in status["roundHistory"]} == {smallest}
    for worker in WIDTHS:  # both split every step with the same M: the round's
        rounds = ROUND_LINE.findall(worker_log(job_dir, worker))
        assert rounds and {int(m) for _, _, m in rounds} == {smallest}, (worker, rounds)
    assert status["memoryPeak"]["device"] == "cpu" and status["memoryPeak"]["peakBytes"] > 0


def test_a_resumed_job_reads_the_probe_cache(two_widths):
    job_dir, _, _, cache, first, resumed = two_widths
    assert first.returncode == 0 and resumed.returncode == 0, (first.stderr + resumed.stderr)[-3000:]
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded" and status["epochs"] == 2
    for worker, probe in status["maxMicroBatchChoice"]["probes"].items():
        log = worker_log(job_dir, worker)  # both runs' output: the resumed workers append to it
        assert probe["cached"] is True
        assert log.count(f"max micro-batch {probe['maxMicroBatch']} read from the cache") == 1
        assert log.count("measured") == 1  # by the first run only
    assert (job_dir / "probe" / "micro_batch.json").read_text() == cache


def test_a_worker_that_runs_out_of_memory_with_a_hand_set_m_fits_with_auto(digits_data, tmp_path):
    """RLIMIT_DATA on the worker (wide_digits.py's FT_RLIMIT_HEADROOM: the kernel refuses allocations past
    it, torch raises "can't allocate memory"). M = G needs one 512 MiB tensor, past the limit: the job
    fails naming the error. auto with a --memory-limit under the headroom finds M = 3 and trains.
    MALLOC_MMAP_THRESHOLD_ pins glibc's threshold, so freed tensors go back to the kernel at once."""
    data = counting_data(digits_data, tmp_path / "data", records=128)
    env = {"FT_WIDE": str(1 << 21), "FT_RLIMIT_HEADROOM": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": "131072",
           "FLEXTRAIN_LOG_LEVEL": "INFO"}  # 8 MiB of activation per sample; 24 MiB per sample in a step
    common = ("train", "--model-def", WIDE_MODEL, "--training-data", str(data), "--global-batch-size", str(G),
              "--no-progress")
    # No preflight: it would run M samples too (without the worker's limit), and the point is the worker.
    hand_set = run_flextrain(*common, "--max-micro-batch", str(G), "--no-preflight", "--max-task-retries", "0",
                             "--job-dir", str(tmp_path / "hand-set"), env_extra=env)
    assert hand_set.returncode != 0
    failed = read_status(tmp_path / "hand-set")
    assert failed["phase"] == "Failed" and "can't allocate memory" in failed["message"]
    assert failed["failure"]["exception"] == "RuntimeError" and "can't allocate memory" in failed["failure"]["message"]

    auto = run_flextrain(*common, "--max-micro-batch", "auto", "--memory-limit", "80MiB",
                         "--job-dir", str(tmp_path / "auto"), env_extra=env)
    assert auto.returncode == 0, auto.stderr[-3000:]
    status = read_status(tmp_path / "auto")
    assert status["phase"] == "Succeeded" and status["maxMicroBatch"] == 3
    assert "can't allocate" not in worker_log(tmp_path / "auto", "worker-0")
