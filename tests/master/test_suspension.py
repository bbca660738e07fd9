"""Suspend and resume decided by the master (flextrain/master/suspension.py), with a recording launch backend:
who is released and relaunched, the phases, and what is refused and why."""

from __future__ import annotations

from ft_helpers import FakeBackend

from flextrain.data import Shard
from flextrain.job import JobSpec, Strategy
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.instances import InstanceManager
from flextrain.master.ledger import TaskLedger
from flextrain.master.suspension import Suspension


def make(tmp_path, **spec_kw):
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                      global_batch_size=10, workers=2, **spec_kw).validate()
    job = JobMaster(spec, TaskLedger(shards=[Shard("s.rio", 0, 40)], epochs=1, global_batch_size=10, steps_per_task=2))
    backend = FakeBackend()
    manager = InstanceManager(backend, desired=2, relaunch_budget=1, worker_args=lambda w: (), worker_env=lambda w: {},
                              on_launch=job.worker_launched, on_exit=lambda w, c: job.worker_exited(w),
                              on_budget_exhausted=lambda m: None, on_retire=job.retire, judge=job.worker_failed)
    manager.reconcile()
    return job, backend, Suspension(job, manager=lambda: manager)


def test_suspend_waits_for_every_worker_then_resume_launches_as_many_new_ones(tmp_path):
    job, backend, suspension = make(tmp_path)
    assert backend.live == {"worker-0", "worker-1"}
    assert suspension.request(True, "test") == (True, "suspending: the workers stop at the next step boundary "
                                                      "after a checkpoint")
    assert job.phase is Phase.PENDING and job.stopping  # the workers are told to stop (the stop checkpoint)
    backend.exit("worker-0", 0)
    suspension.tick()
    assert job.phase is not Phase.SUSPENDED  # worker-1 still runs
    backend.exit("worker-1", 0)
    suspension.tick()
    assert job.phase is Phase.SUSPENDED and backend.live == set()  # released, none relaunched
    assert "resume continues from the start (no checkpoint yet)" in job.message
    assert suspension.request(True, "again") == (False, "cannot suspend: job already Suspended")

    accepted, message = suspension.request(False, "test")
    assert accepted and message == "resuming with 2 worker(s)"
    assert job.phase is Phase.PENDING and not job.stopping
    assert backend.live == {"worker-2", "worker-3"}


def test_a_resume_asked_while_suspending_is_done_once_suspended(tmp_path):
    job, backend, suspension = make(tmp_path)
    suspension.request(True, "test")
    assert suspension.request(False, "early") == (True, "resuming once the suspend under way completes")
    for w in ("worker-0", "worker-1"):
        backend.exit(w, 0)
    suspension.tick()
    assert job.phase is Phase.PENDING and backend.live == {"worker-2", "worker-3"}
    assert any("suspended" in e for e in job.events) and "resumed (early)" in job.message


def test_workers_that_do_not_leave_in_time_are_killed(tmp_path):
    job, backend, suspension = make(tmp_path)
    now = [0.0]
    suspension.clock = lambda: now[0]
    suspension.request(True, "test")
    now[0] = suspension.grace + 1
    suspension.tick()
    assert sorted(backend.terminated) == ["worker-0", "worker-1"]


def test_what_cannot_be_suspended_or_resumed_is_refused_with_the_reason(tmp_path):
    job, _, suspension = make(tmp_path)
    assert suspension.request(False, "x") == (False, "cannot resume: the job is Pending, not Suspended")
    job.finish(Phase.FAILED, "gone")
    assert suspension.request(True, "x") == (False, "cannot suspend: job already Failed")
    _, _, ps = make(tmp_path / "ps", strategy=Strategy.PARAMETER_SERVER, ps=1)
    assert ps.request(True, "x") == (False, "cannot suspend: suspend is not supported yet for ParameterServer jobs")
    _, _, spares = make(tmp_path / "sp", spares=1)
    assert spares.request(True, "x") == (False, "cannot suspend: suspend is not supported yet for jobs with "
                                                "--spare-workers")
