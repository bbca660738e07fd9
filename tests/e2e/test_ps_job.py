"""ParameterServer jobs end to end: `flextrain train --distribution-strategy ParameterServer`.

Real master, PS and worker processes on loopback, the DeepFM-style CTR model
on the synthetic click log (`flextrain data ctr`), whose majority class
(no click) is about 70 % of the records.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ft_helpers import MODEL_ZOO, command_line, flextrain_cmd, ps_counts, read_status, run_flextrain, wait_for

pytestmark = pytest.mark.e2e

DEEPFM_MODEL = f"{MODEL_ZOO / 'deepfm_torch.py'}:Model"
ROWS = 10000


@pytest.fixture(scope="module")
def ctr_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ctr")
    proc = run_flextrain("data", "ctr", "--out", str(out), "--rows", str(ROWS), "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    return out


def _train_args(ctr_data: Path, job_dir: Path, *extra: str) -> list[str]:
    return ["train", "--model-def", DEEPFM_MODEL, "--training-data", str(ctr_data / "train"),
            "--validation-data", str(ctr_data / "validation"), "--distribution-strategy", "ParameterServer",
            "--ps", "2", "--workers", "2", "--global-batch-size", "128", "--epochs", "2",
            "--lr", "0.02", "--job-dir", str(job_dir), *extra]


@pytest.fixture(scope="module")
def trained_ps_job(ctr_data, tmp_path_factory):
    """(job directory, seconds) of a finished 2-PS, 2-worker job on the CTR data."""
    job_dir = tmp_path_factory.mktemp("ps-job") / "job"
    started = time.monotonic()
    proc = run_flextrain(*_train_args(ctr_data, job_dir), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return job_dir, time.monotonic() - started


def test_ps_job_trains_ctr_model_above_majority_rate(trained_ps_job):
    job_dir, seconds = trained_ps_job
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 2 * 8000
    assert status["metrics"]["accuracy"] > 0.74, status["metrics"]  # majority class: ~0.70
    assert status["metrics"]["logloss"] < 0.55, status["metrics"]
    assert status["metrics"]["auc"] > 0.75, status["metrics"]  # 0.5: no better than chance
    # The workers' parameter-server calls, as the heartbeats summed them (the metrics' flextrain_ps_*):
    # every minibatch (2 epochs x 8000 records / G) is pushed once at least, and pulls moved bytes.
    traffic = status["psTraffic"]
    assert traffic["pushes"] >= 2 * 8000 // 128 and traffic["pushSeconds"] > 0 and traffic["pushBytes"] > 0
    assert traffic["pulls"] > 0 and traffic["pullBytes"] > 0
    logs = sorted(p.name for p in (job_dir / "logs").glob("*.log"))
    assert logs == ["ps-0.log", "ps-1.log", "worker-0.log", "worker-1.log"]
    # each PS wrote checkpoints of its own shard
    for i in range(2):
        assert list((job_dir / "ps-checkpoints" / f"ps-{i}").glob("*.ckpt")), f"no checkpoint of ps-{i}"
    assert seconds < 90


def test_a_ps_jobs_model_is_evaluated_and_predicted_from_its_shards(trained_ps_job, ctr_data, tmp_path):
    """evaluate/predict --checkpoint PS_JOB_DIR: the shards exported to one checkpoint give exactly the
    final evaluation the training job ran on its parameter servers, and a prediction per record."""
    job_dir, _ = trained_ps_job
    trained = read_status(job_dir)["metrics"]
    evaluated = run_flextrain("evaluate", "--model-def", DEEPFM_MODEL, "--validation-data",
                              str(ctr_data / "validation"), "--checkpoint", str(job_dir), "--workers", "2",
                              "--no-progress", "--job-dir", str(tmp_path / "eval"), timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = read_status(tmp_path / "eval")["metrics"]
    for name in ("accuracy", "auc", "logloss"):
        assert metrics[name] == pytest.approx(trained[name], abs=1e-5), (name, metrics, trained)
    assert (tmp_path / "eval" / "ps-model.ckpt").is_file()
    predicted = run_flextrain("predict", "--model-def", DEEPFM_MODEL, "--prediction-data",
                              str(ctr_data / "validation"), "--checkpoint", str(job_dir / "ps-checkpoints"),
                              "--output", str(tmp_path / "out"), "--no-progress", "--job-dir",
                              str(tmp_path / "predict"), timeout=120)
    assert predicted.returncode == 0, predicted.stderr
    from flextrain.data.predictions import read_predictions

    assert len(read_predictions(tmp_path / "out")) == ROWS // 5  # the validation records


def _pid_with(*needles: str) -> int | None:
    """The pid of the process whose command line holds every one of ``needles`` (this job's only)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = command_line(entry.name)
            except OSError:
                continue
            if all(n in cmdline for n in needles):
                return int(entry.name)
    return None


def _ps_pid(address_file: Path) -> int | None:
    """The pid of the PS process started with ``--address-file address_file``."""
    return _pid_with(str(address_file))


def test_killed_ps_is_relaunched_and_job_completes(ctr_data, tmp_path):
    job_dir = tmp_path / "job"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(flextrain_cmd(*_train_args(ctr_data, job_dir, "--ps-checkpoint-steps", "5")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        kill_ps(job_dir, 0, after_records=2001, timeout=60)
    finally:
        code, stderr = _finish(proc, timeout=120)
    assert code == 0, stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"]
    assert status["metrics"]["accuracy"] > 0.72, status["metrics"]
    # the relaunched PS listened on the same address, starting from its checkpoint, not from scratch
    starts = re.findall(r"PS 0/2 listening on (\S+) \(version (\d+)", (job_dir / "logs" / "ps-0.log").read_text())
    assert len(starts) == 2, starts
    assert starts[0][0] == starts[1][0]
    assert int(starts[0][1]) == 0 and int(starts[1][1]) >= 5


def test_killed_worker_is_replaced_and_every_record_is_counted_once(ctr_data, tmp_path):
    job_dir = tmp_path / "job"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(flextrain_cmd(*_train_args(ctr_data, job_dir, "--steps-per-task", "20")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        status = wait_for(lambda: (job_dir / "status.json").is_file() and
                          (s := read_status(job_dir))["progress"]["recordsDone"] > 0 and s,
                          timeout=60, what="training under way")
        # no rounds with parameter servers: the workers taking tasks are the active ones (it said 0)
        wait_for(lambda: read_status(job_dir)["workers"]["active"] >= 1, timeout=30, what="active workers")
        pid = _pid_with("--master", status["masterAddress"], "--worker-id", "worker-0")
        assert pid is not None
        time.sleep(1.0)  # in the middle of its second task
        os.kill(pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 2 * 8000
    assert (job_dir / "logs" / "worker-2.log").is_file()  # the replacement
    assert status["metrics"]["accuracy"] > 0.72, status["metrics"]


def test_parameter_server_without_ps_is_a_clear_error(ctr_data, tmp_path):
    proc = run_flextrain("train", "--model-def", DEEPFM_MODEL, "--training-data", str(ctr_data / "train"),
                         "--distribution-strategy", "ParameterServer", "--job-dir", str(tmp_path / "job"),
                         timeout=60)
    assert proc.returncode == 2
    assert "--ps" in proc.stderr and "ParameterServer" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "job" / "status.json").exists()


# ---- exactly once, with a model that counts on the PS how often each record was applied

COUNTING_PS = f"{Path(__file__).resolve().parent / 'zoo' / 'counting_ps.py'}:Model"
G = 32


def _counting_job(digits_data, tmp_path, *extra: str, records: int = 1408, epochs: int = 2, env=None):
    from ft_helpers import counting_data

    data = counting_data(digits_data, tmp_path / "data", records=records)
    job_dir = tmp_path / "job"
    cmd = flextrain_cmd("train", "--model-def", COUNTING_PS, "--training-data", str(data),
                        "--distribution-strategy", "ParameterServer", "--ps", "2", "--workers", "2",
                        "--global-batch-size", str(G), "--lr", str(G), "--epochs", str(epochs),
                        "--job-dir", str(job_dir), *extra)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FT_COUNT_RECORDS": str(records), **(env or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env), job_dir


def kill_ps(job_dir: Path, index: int, *, after_records: int, timeout: float = 90) -> None:
    """SIGKILL ps-``index`` once ``after_records`` records are done, and wait for its relaunch."""
    wait_for(lambda: (job_dir / "status.json").is_file()
             and read_status(job_dir)["progress"]["recordsDone"] >= after_records,
             timeout=timeout, what=f"{after_records} records done")
    address = job_dir / "ps" / f"ps-{index}.addr"
    pid = _ps_pid(address)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (p := _ps_pid(address)) is not None and p != pid, timeout=30, what=f"ps-{index} relaunched")


def run_killing_ps_1_in_the_second_epoch(digits_data, tmp_path, *extra: str) -> Path:
    """A 3-epoch counting job whose ps-1 is SIGKILLed once the first epoch's 1408 records
    are done; asserts the job still succeeded with every record counted by the master."""
    proc, job_dir = _counting_job(digits_data, tmp_path, *extra, epochs=3, env={"FT_FEED_DELAY": "0.03"})
    try:
        kill_ps(job_dir, 1, after_records=1408)
    finally:
        code, stderr = _finish(proc)
    assert code == 0, stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == 3 * 1408
    return job_dir


def _finish(proc, timeout=180):
    try:
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stderr


def test_killed_worker_costs_nothing_and_applies_nothing_twice(digits_data, tmp_path):
    # worker-0 kills itself right after pushing its 12th minibatch, mid-task, before a heartbeat can
    # report it: the task is requeued from the last minibatch reported
    # One worker, so worker-0 surely reaches its 13th minibatch (with two, a slow start let the
    # other worker take every task first).
    proc, job_dir = _counting_job(digits_data, tmp_path, "--steps-per-task", "20", "--workers", "1",
                                  env={"FT_DIE_WORKER": "worker-0", "FT_DIE_AFTER": "13", "FT_FEED_DELAY": "0.01"})
    code, stderr = _finish(proc)
    assert code == 0, stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 2 * 1408
    assert (job_dir / "logs" / "worker-1.log").is_file()  # the replacement: worker-0 did die
    dense, rows = ps_counts(job_dir, 1408)
    assert dense.tolist() == [2.0] * 1408  # every record applied exactly once per epoch, on each PS
    assert rows.tolist() == [2.0] * 1408


def test_killed_ps_loses_nothing_it_acknowledged(digits_data, tmp_path):
    job_dir = run_killing_ps_1_in_the_second_epoch(digits_data, tmp_path, "--ps-checkpoint-steps", "5")
    assert len(re.findall(r"PS 1/2 listening", (job_dir / "logs" / "ps-1.log").read_text())) == 2
    dense, rows = ps_counts(job_dir, 1408)
    assert dense.tolist() == [3.0] * 1408
    assert rows.tolist() == [3.0] * 1408


def test_sync_gradients_held_back_at_the_end_are_applied(digits_data, tmp_path):
    # 43 minibatches, grads_to_wait 2: each PS holds the last push back until the job flushes it
    records = 43 * G
    proc, job_dir = _counting_job(digits_data, tmp_path, "--grads-to-wait", "2", records=records, epochs=1)
    code, stderr = _finish(proc)
    assert code == 0, stderr
    dense, rows = ps_counts(job_dir, records)
    # an update averages two pushes (1/2 per record); the flushed one stands alone (1 per record)
    for counts in (dense, rows):
        assert set(counts.tolist()) == {0.5, 1.0}, set(counts.tolist())
    alone = (dense == 1.0).nonzero().reshape(-1).tolist()
    assert len(alone) == G and alone[0] % G == 0 and alone == list(range(alone[0], alone[0] + G))


def test_stopped_ps_job_resumes_and_applies_every_record_once(digits_data, tmp_path):
    proc, job_dir = _counting_job(digits_data, tmp_path, "--ps-checkpoint-steps", "5", epochs=3,
                                  env={"FT_FEED_DELAY": "0.03"})
    try:
        wait_for(lambda: (job_dir / "status.json").is_file()
                 and read_status(job_dir)["progress"]["recordsDone"] >= 1408,
                 timeout=90, what="the second epoch under way")
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does: stop (`flextrain stop` takes the same path)
    finally:
        code, stderr = _finish(proc)
    stopped = read_status(job_dir)
    assert code == 1 and stopped["phase"] == "Failed", stderr
    assert "stopped: interrupted" in stopped["message"] and "resume with" in stopped["message"]
    assert 1408 <= stopped["progress"]["recordsDone"] < 3 * 1408

    resumed = run_flextrain("train", "--resume", str(job_dir), timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 3 * 1408
    dense, rows = ps_counts(job_dir, 1408)
    assert dense.tolist() == [3.0] * 1408  # nothing applied twice across the stop, nothing lost
    assert rows.tolist() == [3.0] * 1408

    again = run_flextrain("train", "--resume", str(job_dir), timeout=120)
    assert again.returncode != 0 and "already finished training" in again.stderr
    assert "Traceback" not in again.stderr


def test_an_optimizer_the_ps_cannot_run_is_refused_at_submission(ctr_data, tmp_path):
    module = tmp_path / "rms.py"
    module.write_text((MODEL_ZOO / "deepfm_torch.py").read_text() +
                      "\n\ndef optimizer(params, lr=0.01):\n    return torch.optim.RMSprop(params, lr=lr)\n")
    proc = run_flextrain("train", "--model-def", f"{module}:Model", "--training-data", str(ctr_data / "train"),
                         "--distribution-strategy", "ParameterServer", "--ps", "1", "--job-dir", str(tmp_path / "job"),
                         timeout=60)
    assert proc.returncode == 2
    assert "rms.py" in proc.stderr and "`optimizer` returns RMSprop" in proc.stderr
    assert "torch.optim.SGD" in proc.stderr  # what it can run instead
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "job" / "status.json").exists()
