"""What an out-of-memory kill changes (flextrain/master/oom.py): a memory ladder's next size first, then half
the micro-batch (once per round's M), and at micro-batch 1 the job's failure; the planner keeps G."""

from __future__ import annotations

from flextrain.elastic.planner import plan_step
from flextrain.job import JobSpec
from flextrain.master.memory import MicroBatchChoice
from flextrain.master.oom import OutOfMemory


def test_halving_keeps_the_global_batch_and_raises_the_accumulation_steps():
    choice = MicroBatchChoice(JobSpec.of(name="j", model_def="m.py:M", job_dir="/tmp/j", global_batch_size=64,
                                         max_micro_batch=32))
    assert choice.for_round(["worker-0", "worker-1"])[0] == 32
    action, fatal = choice.oom.killed("worker-0", round_m=32)
    assert not fatal and "32 -> 16" in action
    m, why = choice.for_round(["worker-1", "worker-2"])
    assert m == 16 and "OOMKilled" in why
    before, after = plan_step(64, 2, 32), plan_step(64, 2, m)
    assert (before.accumulation_steps, after.accumulation_steps) == (1, 2)
    assert sum(after.micro_batches) == sum(before.micro_batches) == 64
    assert choice.status()["maxMicroBatchChoice"]["outOfMemory"][0]["worker"] == "worker-0"


def test_two_kills_of_one_round_halve_once_and_a_later_round_halves_again():
    oom = OutOfMemory()
    oom.killed("worker-0", round_m=16)
    action, fatal = oom.killed("worker-1", round_m=16)  # the same round's other member
    assert oom.cap == 8 and not fatal and "already plans with 8" in action
    oom.killed("worker-2", round_m=8)
    assert oom.cap == 4 and len(oom.actions) == 2


def test_at_micro_batch_one_the_kill_is_fatal():
    oom = OutOfMemory(cap=1)
    action, fatal = oom.killed("worker-3", round_m=1)
    assert fatal and "smallest micro-batch 1" in action


def test_a_memory_ladder_is_climbed_before_the_micro_batch_is_lowered():
    oom = OutOfMemory(ladder=("4Gi", "8Gi"))
    assert oom.memory is None
    assert "memory 4Gi" in oom.killed("worker-0", round_m=16)[0] and oom.memory == "4Gi" and oom.cap is None
    assert "memory 8Gi" in oom.killed("worker-1", round_m=16)[0] and oom.memory == "8Gi"
    assert "16 -> 8" in oom.killed("worker-2", round_m=16)[0] and oom.memory == "8Gi" and oom.cap == 8
