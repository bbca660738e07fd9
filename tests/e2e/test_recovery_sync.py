"""A recovery whose survivors stand at the same step starts their new round without a state
broadcast, and their models stay identical; a newcomer still gets the state.

worker-1 hangs inside ``feed`` (tests/e2e/zoo/counting_digits.py): its step never reaches the
all-reduce, so the other two block in that step's all-reduce at the same version. Killing worker-1
then fails both in the same collective: both are synced survivors of the round at one version.
"""

from __future__ import annotations

import os
import signal

import pytest

from ft_helpers import (assert_exactly_once_at_latest_checkpoint, assert_members_identical, counting_data,
                        finish, last_step_before, member_checksums, read_status, round_started_in_sync, run_flextrain,
                        steps_shared_by, wait_for)
from test_elastic import last_round, start_job, status, survivors_then_replacement

pytestmark = pytest.mark.e2e


def test_survivors_at_one_step_skip_the_broadcast_and_stay_identical(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir, sums, trigger = tmp_path / "job", tmp_path / "checksums", tmp_path / "hang-now"
    sums.mkdir()
    env = {"FT_CHECKSUM_DIR": str(sums), "FLEXTRAIN_LOG_LEVEL": "INFO",  # the worker logs say how rounds start
           "FT_HANG_WORKER": "worker-1", "FT_HANG_FILE": str(trigger)}
    proc = start_job(data, digits_data, job_dir, "--workers", "3", "--min-workers", "1", "--max-workers", "4",
                     "--epochs", "1000", env=env)
    try:
        first = wait_for(lambda: (r := last_round(job_dir)) and len(r["members"]) == 3 and
                         status(job_dir)["step"] > r["version"] + 30 and r, timeout=180, what="3 workers training")
        victim = next(m for m in first["members"] if m["id"] == "worker-1")
        survivors = [m["id"] for m in first["members"] if m is not victim]
        trigger.touch()
        wait_for(lambda: trigger.with_name("hang-now.hung").exists(), timeout=60, what="worker-1 hanging in feed")
        os.kill(victim["pid"], signal.SIGKILL)
        two, three = survivors_then_replacement(job_dir, first)
        wait_for(lambda: status(job_dir)["step"] > three["version"] + 30, timeout=60, what="training with three")
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1 and "resume with" in read_status(job_dir)["message"], err
    by_step = member_checksums(sums)
    assert len({last_step_before(by_step, w, two["time"]) for w in survivors}) == 1  # the premise
    assert two["membersInSync"] and not three["membersInSync"]
    assert [round_started_in_sync(job_dir, w, two["round"]) for w in survivors] == [True, True]
    newcomer = next(m["id"] for m in three["members"] if m["id"] not in survivors)
    assert [round_started_in_sync(job_dir, m["id"], three["round"]) for m in three["members"]] == [False] * 3
    assert_members_identical(by_step)
    assert steps_shared_by(by_step, survivors) > steps_shared_by(by_step, [m["id"] for m in first["members"]])
    assert steps_shared_by(by_step, [*survivors, newcomer])  # the newcomer's broadcast state, compared
    assert_exactly_once_at_latest_checkpoint(job_dir)
