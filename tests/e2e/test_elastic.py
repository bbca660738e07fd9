"""Workers die, hang and join while a job runs: training carries on in-process,
the global batch stays fixed, and every record is applied exactly once per epoch.

The counting model (tests/e2e/zoo/counting_digits.py) keeps, in its own state,
how often each training record reached a committed optimizer step.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess

import pytest
import torch

from flextrain.elastic.statecodec import decode
from flextrain.worker.module import FeedMetadata
from ft_helpers import (COUNTING_MODEL, alive, assert_exactly_once_at_latest_checkpoint, assert_members_identical,
                        counting_data, finish, flextrain_cmd, last_step_before, member_checksums, read_status,
                        round_started_in_sync, run_flextrain, seen_counts, steps_shared_by, wait_for)

pytestmark = pytest.mark.e2e

G = 32


def start_job(data, digits_data, job_dir, *extra, env=None):
    cmd = flextrain_cmd(
        "train", "--model-def", COUNTING_MODEL, "--training-data", str(data),
        "--global-batch-size", str(G), "--max-micro-batch", "8", "--lr", "0.05", "--job-dir", str(job_dir), *extra,
    )
    env = {**os.environ, "FT_COUNT_G": str(G), **(env or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def status(job_dir):
    return read_status(job_dir) if (job_dir / "status.json").exists() else None


def last_round(job_dir):
    s = status(job_dir)
    return s["roundHistory"][-1] if s and s["roundHistory"] and s["phase"] == "Running" else None


def validation_accuracy(job_dir, digits_data):
    """Accuracy on the validation digits of the model in the latest checkpoint."""
    import importlib.util

    from flextrain.data import read_records

    path = COUNTING_MODEL.split(":")[0]
    spec = importlib.util.spec_from_file_location("counting_eval", path)
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    meta = json.loads((job_dir / "checkpoints" / "latest.json").read_text())
    state = decode(open(job_dir / "checkpoints" / meta["checkpoint"], "rb").read())
    model = zoo.Model()
    model.load_state_dict(state["model"])
    records = [r for f in sorted((digits_data / "validation").glob("*.rio")) for r in read_records(f)]
    x, y = zoo.feed(records, "evaluation", FeedMetadata("validation", 0, 0, 0))
    x["id"] = torch.zeros_like(x["id"])  # ids index the training counter only
    with torch.no_grad():
        return (model(x)["logits"].argmax(dim=1) == y).float().mean().item()


def survivors_then_replacement(job_dir, first):
    """After a member of round ``first`` (of three) was killed: the round the two survivors formed
    and the one its replacement joined."""
    def rounds_after():
        s = status(job_dir)
        return [r for r in s["roundHistory"] if r["round"] > first["round"]] if s else []

    two = wait_for(lambda: [r for r in rounds_after() if len(r["members"]) == 2], timeout=60,
                   what="a round of the two survivors")[0]
    three = wait_for(lambda: [r for r in rounds_after() if len(r["members"]) == 3], timeout=120,
                     what="the replacement joining")[0]
    return two, three


def test_kill_one_of_three_survivors_continue_in_process_then_a_new_worker_joins(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    # Long enough never to end by itself: it is stopped once the replacement has joined,
    # and exactly-once and accuracy are checked on the stop checkpoint.
    sums = tmp_path / "checksums"
    sums.mkdir()
    proc = start_job(data, digits_data, job_dir, "--workers", "3", "--min-workers", "1", "--max-workers", "4",
                     "--epochs", "1000", env={"FT_CHECKSUM_DIR": str(sums), "FLEXTRAIN_LOG_LEVEL": "INFO"})
    try:
        first = wait_for(lambda: (r := last_round(job_dir)) and len(r["members"]) == 3 and
                         status(job_dir)["step"] > 200 and r, timeout=180, what="3 workers training")
        victim = first["members"][1]
        survivors = {m["id"]: m["pid"] for m in first["members"] if m is not victim}
        os.kill(victim["pid"], signal.SIGKILL)
        two, three = survivors_then_replacement(job_dir, first)
        # survivors re-formed a round of two, same processes (no restart) ...
        assert {m["id"]: m["pid"] for m in two["members"]} == survivors
        assert all(alive(pid) for pid in survivors.values())
        assert two["version"] > first["version"]  # training went on from where it was
        # ... then the replacement joined and the job is back to three
        ids = {m["id"] for m in three["members"]}
        assert set(survivors) < ids and victim["id"] not in ids
        assert {m["pid"] for m in three["members"] if m["id"] in survivors} == set(survivors.values())
        wait_for(lambda: status(job_dir)["step"] > three["version"] + 50, timeout=60, what="training with three")
        assert status(job_dir)["phase"] == "Running"
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1 and "resume with" in read_status(job_dir)["message"], err
    assert_exactly_once_at_latest_checkpoint(job_dir)
    assert validation_accuracy(job_dir, digits_data) > 0.90
    # The survivors' round skipped the state broadcast exactly when both stood at the same step (a
    # peer killed inside a collective may leave them a step apart); the replacement's round always
    # broadcast (a newcomer is never skipped); and the members' states never differed.
    by_step = member_checksums(sums)
    at_kill = {last_step_before(by_step, w, two["time"]) for w in survivors}
    assert all(round_started_in_sync(job_dir, w, two["round"]) is (len(at_kill) == 1) for w in survivors)
    assert all(round_started_in_sync(job_dir, m["id"], three["round"]) is False for m in three["members"])
    assert_members_identical(by_step, killed=[victim["id"]])
    assert steps_shared_by(by_step, survivors) > steps_shared_by(by_step, {m["id"] for m in first["members"]})
    assert steps_shared_by(by_step, {m["id"] for m in three["members"]})


def test_exactly_once_across_many_kills_joins_and_scaling(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    proc = start_job(data, digits_data, job_dir, "--workers", "3", "--min-workers", "1", "--max-workers", "4",
                     "--epochs", "1000", "--relaunch-budget", "20", "--steps-per-task", "4")
    rng = random.Random(1)
    events = 0
    try:
        seen_round = -1
        for kill in range(6):
            rnd = wait_for(lambda: (r := last_round(job_dir)) and r["round"] >= seen_round and
                           len(r["members"]) >= 2 and all(alive(m["pid"]) for m in r["members"]) and
                           status(job_dir)["step"] > r["version"] + 5 and r,
                           timeout=120, what=f"a fresh round training before kill {kill}")
            victim = rnd["members"][rng.randrange(len(rnd["members"]))] if kill != 2 else rnd["members"][0]
            os.kill(victim["pid"], signal.SIGKILL)  # kill 2 takes rank 0, the state broadcaster
            events += 1
            # the replacement must join before the next kill
            joined = wait_for(lambda: (r := last_round(job_dir)) and r["round"] > rnd["round"] and
                              any(m["id"] not in {x["id"] for x in rnd["members"]} for m in r["members"]) and r,
                              timeout=120, what=f"a replacement after kill {kill}")
            events += 1
            seen_round = joined["round"]
            if kill == 2:
                refused = run_flextrain("scale", str(job_dir), "9")
                assert refused.returncode == 2 and "cannot scale to 9 workers" in refused.stderr
                assert run_flextrain("scale", str(job_dir), "4").returncode == 0
                seen_round = wait_for(lambda: (r := last_round(job_dir)) and len(r["members"]) == 4 and r,
                                      timeout=120, what="scale up to 4")["round"]
                events += 1
            if kill == 4:
                assert run_flextrain("scale", str(job_dir), "2").returncode == 0
                seen_round = wait_for(lambda: (r := last_round(job_dir)) and len(r["members"]) == 2 and r,
                                      timeout=120, what="scale down to 2")["round"]
                events += 1
        assert status(job_dir)["phase"] == "Running", "the job must still run after all the churn"
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        code, err = finish(proc)
    finally:
        proc.kill()
    assert events >= 10
    assert code == 1 and "resume with" in read_status(job_dir)["message"], err
    assert read_status(job_dir)["rounds"] >= 12
    assert_exactly_once_at_latest_checkpoint(job_dir)


def finish_after_trigger(proc, job_dir, trigger, *, then=None):
    """Touch ``trigger`` once the job has trained a little (then call ``then``); the job must then
    succeed: its final status."""
    try:
        wait_for(lambda: (s := status(job_dir)) and s["step"] > 20, timeout=120, what="training progress")
        trigger.touch()
        if then is not None:
            then()
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err
    return read_status(job_dir)


def test_hung_worker_is_replaced_and_its_task_recovered(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    trigger, calm = tmp_path / "hang-now", tmp_path / "replaced"
    epochs = 10
    # The stand-in compute (0.05 s a feed: >= 0.1 s a step) keeps the job from ending before the hung
    # worker is replaced; it is lifted then (FT_FEED_DELAY_UNTIL), and the rest trains at full speed.
    proc = start_job(data, digits_data, job_dir, "--workers", "3", "--epochs", str(epochs),
                     "--worker-timeout", "3", "--min-workers", "2", "--max-workers", "3",
                     env={"FT_HANG_WORKER": "worker-1", "FT_HANG_FILE": str(trigger), "FT_FEED_DELAY": "0.05",
                          "FT_FEED_DELAY_UNTIL": str(calm)})

    def replaced():
        wait_for(lambda: any(m["id"] == "worker-3" for r in status(job_dir)["roundHistory"] for m in r["members"]),
                 timeout=120, what="worker-1's replacement in a round")
        calm.touch()

    # worker-1 then blocks inside feed, heartbeats alive
    final = finish_after_trigger(proc, job_dir, trigger, then=replaced)
    assert any("worker-1 hangs" in e for e in final["events"]), final["events"]
    assert any(m["id"] == "worker-3" for r in final["roundHistory"] for m in r["members"])  # its replacement
    seen, _ = seen_counts(job_dir)
    assert seen.min().item() == seen.max().item() == epochs


def test_a_peer_lost_with_buckets_in_flight_replays_the_step_exactly_once(digits_data, tmp_path):
    """Tiny buckets (--bucket-mb 0.001: one a parameter); worker-1 exits inside a backward once every
    bucket but the tail is in flight (the counting model's FT_EXIT_* hook). The survivors' sums fail,
    they re-form, nothing of that step is applied, and every record is still trained once per epoch."""
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    trigger, calm = tmp_path / "exit-now", tmp_path / "exited"
    epochs = 3
    # The stand-in compute (0.05 s a feed) keeps the job from ending before worker-1's next backward (a
    # slow status poll once saw step 20 so late that the job finished first); lifted once it has exited.
    proc = start_job(data, digits_data, job_dir, "--workers", "3", "--min-workers", "2", "--max-workers", "3",
                     "--epochs", str(epochs), "--max-micro-batch", "32", "--bucket-mb", "0.001",
                     env={"FT_EXIT_WORKER": "worker-1", "FT_EXIT_FILE": str(trigger), "FT_FEED_DELAY": "0.05",
                          "FT_FEED_DELAY_UNTIL": str(calm)})

    def exited():
        wait_for(lambda: any("worker-1 exited" in e for e in status(job_dir)["events"]),
                 timeout=120, what="worker-1's exit in the events")
        calm.touch()

    final = finish_after_trigger(proc, job_dir, trigger, then=exited)
    assert any("worker-1 exited with code 17" in e for e in final["events"]), final["events"]
    survivors = [m["id"] for m in final["roundHistory"][0]["members"] if m["id"] != "worker-1"]
    for worker in survivors:  # both were inside the step's sums when the peer went
        assert "all_reduce in round 0 failed" in (job_dir / "logs" / f"{worker}.log").read_text(), worker
    seen, _ = seen_counts(job_dir)
    assert seen.min().item() == seen.max().item() == epochs


def test_resume_after_stop_trains_each_remaining_record_once(stopped_counting_job):
    job = stopped_counting_job  # 2 workers, 10 epochs, stopped at 10% or more (tests/e2e/conftest.py)
    job_dir, epochs = job.job_dir, job.epochs
    assert job.stop.returncode == 0, job.stop.stderr
    assert job.code == 1
    stopped = job.stopped
    assert stopped["phase"] == "Failed" and "resume with" in stopped["message"]
    ckpt = (job_dir / "checkpoints" / "latest.json")
    assert ckpt.exists()
    name = os.path.basename(json.loads(ckpt.read_text())["checkpoint"])
    mid, step = seen_counts(job_dir, name)
    assert 0 < step < epochs * 1408 // G
    assert set(mid.unique().tolist()) <= {step * G // 1408, step * G // 1408 + 1}  # stopped mid-epoch

    resumed = subprocess.run(
        flextrain_cmd("train", "--resume", str(job_dir)), capture_output=True, text=True, timeout=300,
        env={**os.environ, "FT_COUNT_G": str(G)})
    assert resumed.returncode == 0, resumed.stderr
    seen, version = seen_counts(job_dir)
    assert version == epochs * 1408 // G
    assert seen.min().item() == seen.max().item() == epochs


def test_every_worker_lost_job_waits_for_min_then_fails_keeping_checkpoint(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    proc = start_job(data, digits_data, job_dir, "--workers", "2", "--min-workers", "1", "--max-workers", "2",
                     "--epochs", "100", "--checkpoint-steps", "5", "--relaunch-budget", "0",
                     "--min-workers-timeout", "2")
    try:
        rnd = wait_for(lambda: (job_dir / "checkpoints" / "latest.json").exists() and last_round(job_dir),
                       timeout=120, what="a checkpoint")
        for m in rnd["members"]:
            os.kill(m["pid"], signal.SIGKILL)
        code, err = finish(proc, timeout=120)
    finally:
        proc.kill()
    assert code == 1
    final = read_status(job_dir)
    assert final["phase"] == "Failed"
    assert "fewer than the minimum of 1 (--min-workers)" in final["message"] and "latest checkpoint kept" in final["message"]
    # with --relaunch-budget 0 the first crash exhausts the budget: a clear event, no relaunch loop
    assert any("over the relaunch budget" in e for e in final["events"]), final["events"]
    assert not any(m["id"] not in {"worker-0", "worker-1"} for r in final["roundHistory"] for m in r["members"])
    latest = json.loads((job_dir / "checkpoints" / "latest.json").read_text())
    assert (job_dir / "checkpoints" / latest["checkpoint"]).is_file()
