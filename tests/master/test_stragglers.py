"""Slow workers (flextrain/master/stragglers.py): the tracker's rules on their own, then the master acting
on heartbeats and node checks — reported, queued for replacement within the budget, a PS straggler's tasks
shrunk — driven through JobMaster's own calls."""

from __future__ import annotations

import pytest

from flextrain.data import Shard
from flextrain.job import JobSpec, JobSpecError, Strategy
from flextrain.master.coordinator import JobMaster
from flextrain.master.ledger import TaskLedger
from flextrain.master.stragglers import PATIENCE, StragglerTracker
from flextrain.proto import flextrain_pb2 as pb

G = 10


def feed(tracker, rounds, figures):
    """``rounds`` heartbeats of every worker in ``figures`` ({worker: seconds per sample}); what was found."""
    found = []
    for _ in range(rounds):
        for worker, per_sample in figures.items():
            if (s := tracker.observe(worker, seconds=per_sample * 10, samples=10)) is not None:
                found.append(s)
    return found


def test_a_persistently_slow_worker_is_found_once_after_its_patience():
    tracker = StragglerTracker(factor=2.0)
    figures = {"w0": 0.010, "w1": 0.011, "w2": 0.035}
    assert feed(tracker, tracker.min_reports + PATIENCE - 2, figures) == []  # not yet: too few heartbeats
    found = feed(tracker, 1, figures)
    assert [s.worker_id for s in found] == ["w2"]
    assert found[0].ratio == pytest.approx(0.035 / 0.0105, rel=0.01)
    assert feed(tracker, 5, figures) == []  # reported once, flagged since
    assert tracker.flagged("w2") == pytest.approx(0.035 / 0.0105, rel=0.01) and tracker.flagged("w0") is None


def test_a_blip_is_not_a_straggler_and_a_recovered_worker_is_unflagged():
    tracker = StragglerTracker(factor=2.0)
    feed(tracker, 4, {"w0": 0.01, "w1": 0.01})
    tracker.observe("w1", seconds=0.5, samples=10)  # one slow heartbeat (5x) among fast ones
    assert feed(tracker, 6, {"w0": 0.01, "w1": 0.01}) == []
    assert feed(tracker, 6, {"w0": 0.01, "w1": 0.05}) != []
    assert feed(tracker, PATIENCE + 6, {"w0": 0.01, "w1": 0.01}) == []
    assert tracker.flagged("w1") is None


def test_a_lone_worker_and_a_worker_that_left_are_compared_with_nobody():
    tracker = StragglerTracker(factor=2.0)
    assert feed(tracker, 10, {"w0": 0.05}) == []  # nobody to be slower than
    feed(tracker, 10, {"w1": 0.01})
    tracker.forget("w1")
    assert "w1" not in tracker.snapshot() and feed(tracker, 10, {"w0": 0.05}) == []


def test_node_checks_are_judged_against_the_median_of_those_admitted():
    tracker = StragglerTracker(factor=3.0)
    assert tracker.admit("w0", 0.010) == ""  # the first sets the reference
    assert tracker.admit("w1", 0.012) == ""
    why = tracker.admit("w2", 0.050)
    assert "4.5x the median 11 ms" in why and "--node-check" in why and "--straggler-factor 3" in why
    assert "w2" not in tracker.checks  # a refused check is no reference


def test_a_slow_link_fails_the_node_check_too():
    tracker = StragglerTracker(factor=3.0)
    assert tracker.admit("w0", 0.010, link=0.002) == ""
    assert tracker.admit("w1", 0.011) == ""  # no link figure (the probe could not run): compute alone
    why = tracker.admit("w2", 0.010, link=0.009)
    assert "9 ms of all-reduce with the master per MiB, 4.5x the median 2 ms" in why
    assert tracker.node_checks() == {"w0": {"msPerSample": 10.0, "linkMsPerMiB": 2.0}, "w1": {"msPerSample": 11.0}}


def test_straggler_settings_are_checked_at_submission():
    with pytest.raises(JobSpecError, match="--straggler-policy must be one of off, report, replace"):
        JobSpec.of(name="j", model_def="m.py", training_data="d", job_dir="/tmp/j", straggler_policy="evict").validate()
    with pytest.raises(JobSpecError, match="--straggler-factor must be a number above 1"):
        JobSpec.of(name="j", model_def="m.py", training_data="d", job_dir="/tmp/j", straggler_factor=1.0).validate()
    with pytest.raises(JobSpecError, match="--node-check needs --distribution-strategy AllReduce"):
        JobSpec.of(name="j", model_def="m.py", training_data="d", job_dir="/tmp/j", node_check=True,
                   strategy=Strategy.PARAMETER_SERVER, ps=1).validate()


# ---- the master ------------------------------------------------------------------------------------
def master(tmp_path, *, strategy=Strategy.ALLREDUCE, policy="replace", workers=3, budget=1, records=400):
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=G, steps_per_task=4, workers=workers, strategy=strategy,
                      ps=2 if strategy is Strategy.PARAMETER_SERVER else 0, straggler_policy=policy,
                      relaunch_budget=budget).validate()
    ledger = TaskLedger(shards=[Shard("s.rio", 0, records)], epochs=1, global_batch_size=G, steps_per_task=4)
    return JobMaster(spec, ledger)


def beat(job, figures, rounds):
    for _ in range(rounds):
        for worker, per_sample in figures.items():
            job.heartbeat(pb.HeartbeatRequest(worker_id=worker, position=pb.Position(round_id=-1),
                                              compute_seconds=per_sample * 10, compute_samples=10))


def test_the_master_reports_and_queues_a_straggler_for_replacement_within_the_budget(tmp_path):
    job = master(tmp_path, budget=0, workers=1)  # at least one per worker: one replacement
    for w in ("worker-0", "worker-1", "worker-2"):
        job.register(w, node=f"node-{w[-1]}")
    beat(job, {"worker-0": 0.01, "worker-1": 0.01, "worker-2": 0.04}, 8)
    slow = job.take_slow_workers()
    assert [(s.worker_id, s.node, s.replace) for s in slow] == [("worker-2", "node-2", True)]
    assert "worker-2 on node node-2 is a straggler: 4.0x" in slow[0].message and "replacing it" in slow[0].message
    assert slow[0].message in job.events
    assert job.replacements_left() == 0
    # A second straggler is reported but, with the budget spent, not replaced.
    job.worker_exited("worker-2")
    job.register("worker-3")
    beat(job, {"worker-0": 0.01, "worker-1": 0.01, "worker-3": 0.05}, 8)
    (again,) = job.take_slow_workers()
    assert not again.replace and "not replaced" in again.message


def test_a_replaced_straggler_leaves_the_figures_at_once_though_its_process_lives_on(tmp_path):
    job = master(tmp_path, workers=2)
    for w in ("worker-0", "worker-1"):
        job.register(w)
    beat(job, {"worker-0": 0.01, "worker-1": 0.05}, 8)
    (slow,) = job.take_slow_workers()
    assert slow.replace and job.stragglers.snapshot()["worker-1"]["straggler"]
    job.retire("worker-1")  # what replacing it does first: it leaves at its next step boundary, then exits
    beat(job, {"worker-0": 0.01, "worker-1": 0.05}, 3)  # its last heartbeats, before its exit
    assert set(job.stragglers.snapshot()) == {"worker-0"}  # not a member, not a straggler, in nobody's median


def test_report_policy_only_reports_and_off_does_not_track(tmp_path):
    job = master(tmp_path, policy="report")
    for w in ("worker-0", "worker-1"):
        job.register(w)
    beat(job, {"worker-0": 0.01, "worker-1": 0.05}, 8)
    assert [s.replace for s in job.take_slow_workers()] == [False]
    off = master(tmp_path / "off", policy="off")
    beat(off, {"worker-0": 0.01, "worker-1": 0.05}, 8)
    assert off.take_slow_workers() == [] and off.stragglers.snapshot() == {}


def test_a_failed_node_check_keeps_the_worker_out_and_queues_its_replacement(tmp_path):
    job = master(tmp_path)
    job.worker_launched("worker-1")
    assert job.register("worker-0", node_check=pb.NodeCheck(seconds_per_sample=0.01), node="fast") == ""
    refused = job.register("worker-1", node_check=pb.NodeCheck(seconds_per_sample=0.05), node="slow")
    assert "worker-1 on node slow kept out of the job" in refused and "5.0x the median" in refused
    assert "worker-1" not in job.alive and "worker-1" not in job.launched and "worker-1" in job.dismissed
    assert [(s.worker_id, s.node, s.replace) for s in job.take_slow_workers()] == [("worker-1", "slow", True)]
    assert not job.worker_failed("worker-1", 0)  # its exit is no failure to relaunch or charge


def test_a_parameter_server_stragglers_tasks_shrink_by_its_ratio(tmp_path):
    job = master(tmp_path, strategy=Strategy.PARAMETER_SERVER, workers=2)
    for w in ("worker-0", "worker-1"):
        job.register(w)
    beat(job, {"worker-0": 0.01, "worker-1": 0.04}, 8)
    (slow,) = job.take_slow_workers()
    assert not slow.replace and "its tasks shrink" in slow.message

    def ask(worker):
        return job.get_task(pb.GetTaskRequest(worker_id=worker, round_id=0, kind=pb.Task.TRAINING,
                                              position=pb.Position(round_id=0))).task

    fast, small = ask("worker-0"), ask("worker-1")
    assert fast.end - fast.start == 4 * G
    assert small.end - small.start == G  # 40 records / 4x, whole minibatches
    rest = ask("worker-0")
    assert rest.start == small.end and rest.end - rest.start == 3 * G  # the cut-off part, handed out next
