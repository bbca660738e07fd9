"""Script jobs end to end: `flextrain run` with real agents, real script processes, real gloo.

The example script (examples/elastic_script_torch.py) appends a line to
JOB_DIR/script-log.jsonl each time it starts (round, world size, rank, the
step it restored, its micro-batch and accumulation steps, G) and each time
rank 0 commits, so these tests see what every incarnation of the script did
(tests/script_jobs_support.py).
"""

from __future__ import annotations

import json
import math

import pytest

from ft_helpers import finish, read_status, run_flextrain, wait_for
from script_jobs_support import G, M, committed_after, records, start

pytestmark = pytest.mark.e2e


def test_a_script_job_scales_up_and_survives_a_killed_worker_with_g_fixed_and_its_state_restored(
        script_scaled_and_killed):
    job = script_scaled_and_killed  # 1 worker, scaled to 2, one of the pair killed (tests/conftest.py)
    job_dir, first, pair, again, restored = job.job_dir, job.first, job.pair, job.again, job.restored
    assert job.scaled.returncode == 0, job.scaled.stderr
    in_pair = [r for r in records(job_dir, "start") if r["round"] == pair["round"]]
    assert all(r["restored"] and r["step"] >= 5 for r in in_pair), in_pair  # from the commit, not step 0
    assert job.shown.returncode == 0 and json.loads(job.shown.stdout)["phase"] == "Running", job.shown.stderr
    assert job.victim["id"] not in [m["id"] for m in again["members"]]  # its slot was relaunched
    assert job.code == 0, job.err
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded", status["message"]

    starts = records(job_dir, "start")
    commits = records(job_dir, "commit")
    assert {r["world_size"] for r in starts} == {1, 2}
    for r in starts:  # G is fixed whatever the world: W ranks x `steps` micro-batches cover it
        assert r["G"] == G and r["steps"] == math.ceil(G / (r["world_size"] * M)), r
        assert r["steps"] * r["batch_size"] * r["world_size"] >= G > (r["steps"] * (r["batch_size"] - 1)
                                                                      * r["world_size"]), r
    later = [r for r in starts if r["round"] > first["round"]]
    assert later and all(r["restored"] and r["step"] > 0 and r["step"] % 5 == 0 for r in later), later
    after_kill = [r for r in starts if r["round"] == again["round"]]
    assert min(r["step"] for r in after_kill) >= restored  # never back to 0, nor before the earlier restore
    assert commits[-1]["step"] == 150 and [c["step"] for c in commits] == sorted(c["step"] for c in commits)


def test_a_script_that_raises_fails_the_job_with_its_own_error(tmp_path):
    job_dir = tmp_path / "job"
    proc = start(job_dir, "--workers", "2", script_args=("--steps", "50", "--fail-at-step", "3"))
    code, err = finish(proc)
    assert code == 3, err  # the user's code raised (docs/running-jobs.md, exit codes)
    status = read_status(job_dir)
    assert status["phase"] == "Failed"
    failure = status["failure"]
    assert failure["exception"] == "ValueError" and "failing on purpose at step 3" in failure["message"], failure
    assert "elastic_script_torch.py" in failure["location"], failure
    assert "ValueError: failing on purpose at step 3" in err


def test_flextrain_run_refuses_a_missing_script_before_starting(tmp_path):
    result = run_flextrain("run", "--job-dir", str(tmp_path / "job"), str(tmp_path / "nope.py"))
    assert result.returncode == 2 and "nope.py does not exist" in result.stderr
    assert not (tmp_path / "job").exists()


def test_a_stopped_script_job_resumes_from_its_last_commit(tmp_path):
    job_dir = tmp_path / "job"
    proc = start(job_dir, "--workers", "2", script_args=("--steps", "60", "--step-seconds", "0.1"))
    try:
        wait_for(lambda: committed_after(job_dir, 5, 2), timeout=120, what="a commit past step 5")
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        code, err = finish(proc, timeout=60)
    finally:
        proc.kill()
    assert code == 1 and f"flextrain run --resume {job_dir}" in err, err
    stopped_at = records(job_dir, "commit")[-1]["step"]
    resumed = run_flextrain("run", "--resume", str(job_dir), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    last_starts = records(job_dir, "start")[-2:]
    # from the last commit (its log line may trail a commit the stop cut short), never from 0
    assert all(r["restored"] and r["step"] >= stopped_at and r["step"] % 5 == 0 for r in last_starts), last_starts
    assert records(job_dir, "commit")[-1]["step"] == 60
    assert read_status(job_dir)["step"] == 60  # the step count went on from the commit (it restarted at 1)


def test_a_quick_scripts_last_steps_reach_the_status(tmp_path):
    """Steps reported after the agent's last heartbeat (a script quicker than one period) are sent as it exits:
    the finished job shows every step and sample the script trained (it showed step 0, no loss)."""
    script = tmp_path / "quick.py"
    script.write_text(
        "import torch, flextrain.elastic.torch as e\n"
        "e.init(8, 4)\n"
        "m = torch.nn.Linear(2, 1)\n"
        "opt = e.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1))\n"
        "for _ in range(5 * e.steps):\n"
        "    loss = m(torch.randn(e.batch_size, 2)).pow(2).mean()\n"
        "    opt.scale(loss).backward()\n"
        "    e.report_loss(loss)\n"
        "    opt.step(); opt.zero_grad()\n")
    job_dir = tmp_path / "job"
    result = run_flextrain("run", "--workers", "1", "--no-progress", "--job-dir", str(job_dir), str(script))
    assert result.returncode == 0, result.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded" and status["step"] == 5, status
    assert status["progress"]["recordsDone"] == 5 * 8 and "loss" in status["metrics"], status
    shown = run_flextrain("status", str(job_dir)).stdout.splitlines()  # no epochs or total: the script's own data
    assert "step      5" in shown and "progress  40 samples trained" in shown, shown
