"""Worker failures classified: relaunch for the cluster's faults, fail fast for the job's own."""

from __future__ import annotations

import pytest

from flextrain.failures import ExitCode, FailureKind
from flextrain.master.coordinator import Phase
from flextrain.master.failures import FailureTracker
from flextrain.proto import flextrain_pb2 as pb

from test_coordinator import form, heartbeat, make_master, pos

BOOM = pb.Failure(kind="UserCode", exit_code=3, exception="RuntimeError", message="no vocab",
                  location="/m.py:12 in __init__", stage="starting")


def report_then_exit(tracker: FailureTracker, worker: str, report: pb.Failure | None, code: int, *, step=0):
    if report is not None:
        tracker.reported(worker, report)
    return tracker.exited(worker, code, step=step)


def test_a_signal_is_the_clusters_fault_and_is_relaunched_however_often():
    tracker = FailureTracker()
    for i in range(5):
        verdict = report_then_exit(tracker, f"worker-{i}", None, 137)
        assert verdict.relaunch and verdict.fatal is None
        assert verdict.failure.kind is FailureKind.INFRASTRUCTURE and verdict.failure.summary().endswith("(SIGKILL)")


def test_the_same_user_error_twice_without_progress_fails_naming_the_first():
    tracker = FailureTracker(log_of=lambda w: f"/logs/{w}.log")
    first = report_then_exit(tracker, "worker-0", BOOM, ExitCode.USER_CODE)
    assert first.relaunch and first.fatal is None  # once may be bad luck (a file not mounted yet)
    second = report_then_exit(tracker, "worker-1", BOOM, ExitCode.USER_CODE)
    assert not second.relaunch
    assert second.fatal.worker_id == "worker-0" and second.fatal.log == "/logs/worker-0.log"
    assert second.fatal.cause() == "RuntimeError: no vocab (at /m.py:12 in __init__)"


def test_progress_between_two_equal_errors_means_bad_luck_not_a_broken_job():
    tracker = FailureTracker()
    assert report_then_exit(tracker, "worker-0", BOOM, 3, step=5).relaunch
    assert report_then_exit(tracker, "worker-1", BOOM, 3, step=9).fatal is None
    assert report_then_exit(tracker, "worker-2", BOOM, 3, step=9).fatal is not None


def test_a_broken_contract_or_a_non_finite_loss_fails_at_once():
    for kind, code in (("ModuleContract", ExitCode.MODULE_CONTRACT), ("NonFinite", ExitCode.NON_FINITE)):
        verdict = report_then_exit(FailureTracker(), "worker-0", pb.Failure(kind=kind, exception="ModelDefError",
                                                                             message="m.py: no parameters"), code)
        assert not verdict.relaunch and verdict.fatal.kind.value == kind


def test_a_worker_released_from_a_dead_round_is_no_failure():
    tracker = FailureTracker()
    verdict = tracker.exited("worker-0", ExitCode.RELEASED, step=0)
    assert verdict.relaunch and verdict.failure is None and tracker.history == []


def test_an_unreported_exit_is_unexpected_and_shows_the_end_of_the_log():
    tracker = FailureTracker(tail_of=lambda w: "loading...\nSegmentation fault")
    verdict = tracker.exited("worker-0", 3, step=0)
    failure = verdict.failure
    assert failure.kind is FailureKind.UNEXPECTED_EXIT and failure.exit_code == 3
    assert "exited with code 3 by itself" in failure.message and "Segmentation fault" in failure.message
    zero = tracker.exited("worker-1", 0, step=0).failure
    assert zero.kind is FailureKind.UNEXPECTED_EXIT and "before the master told it to stop" in zero.message


def test_a_hang_the_master_killed_counts_against_the_job_when_it_repeats():
    tracker = FailureTracker()
    tracker.killing("worker-0", "no progress for 61s")
    first = tracker.exited("worker-0", 137, step=3)
    assert first.failure.kind is FailureKind.HANG and first.failure.reason == "killed by the master"
    assert "no progress for 61s" in first.failure.summary() and first.relaunch
    tracker.killing("worker-1", "no progress for 62s")
    assert tracker.exited("worker-1", 137, step=3).fatal is not None


def test_root_cause_prefers_the_jobs_own_failure_over_later_kills():
    tracker = FailureTracker()
    report_then_exit(tracker, "worker-0", BOOM, 3, step=0)
    tracker.exited("worker-1", 137, step=1)
    assert tracker.root_cause().worker_id == "worker-0"


# ---- the JobMaster's side ----------------------------------------------------------------------
def test_a_worker_told_there_is_nothing_left_may_exit_0(tmp_path):
    master, clock = make_master(tmp_path)
    form(master, clock, ["w0"])
    master.finish(Phase.SUCCEEDED, "done")  # the job is over: its workers leave
    assert master.worker_failed("w0", 0) is False and master.failure is None


def test_an_unasked_exit_0_while_training_is_a_failure(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    form(master, clock, ["w0", "w1"])
    assert master.worker_failed("w0", 0) is True  # relaunch, but say so
    assert "w0 exited with code 0 by itself" in master.events[-1]


def test_the_repeated_failure_fails_the_job_with_status_and_exit_code(tmp_path):
    master, clock = make_master(tmp_path)
    for worker in ("w0", "w1"):
        master.worker_launched(worker)
        master.report_failure(worker, BOOM)
    assert master.worker_failed("w0", 3) is True
    assert master.worker_failed("w1", 3) is False
    assert master.phase is Phase.FAILED and master.failure.worker_id == "w0"
    assert master.message.startswith("w0 failed: RuntimeError: no vocab (at /m.py:12 in __init__)")
    status = master.failure.to_status()
    assert status["kind"] == "UserCode" and status["exitCode"] == 3 and status["location"] == "/m.py:12 in __init__"


def test_no_relaunch_left_and_too_few_workers_fails_now_not_after_the_timeout(tmp_path):
    master, clock = make_master(tmp_path, workers=2, min_workers_timeout=300.0)
    master.worker_launched("w0")
    master.report_failure("w0", BOOM)
    master.worker_exited("w0")
    master.worker_failed("w0", 3)
    master.relaunches_exhausted("workers failed 1 times, over the relaunch budget")
    master.tick()
    assert master.phase is Phase.FAILED and "relaunch budget is spent" in master.message
    assert master.failure.worker_id == "w0"


def test_heartbeat_says_the_job_is_over_so_a_blocked_worker_may_leave(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    form(master, clock, ["w0", "w1"])
    round_id = master.rendezvous.current.round_id
    assert not heartbeat(master, "w0", pos(round_id)).job_over
    master.worker_exited("w1")  # a dead round alone is no reason: its survivors keep their state
    assert not heartbeat(master, "w0", pos(round_id)).job_over
    master.finish(Phase.FAILED, "w1 failed")
    assert heartbeat(master, "w0", pos(round_id)).job_over


@pytest.mark.parametrize("kind", ["ModuleContract", "NonFinite"])
def test_a_task_failing_for_a_reason_no_retry_fixes_fails_the_job_at_once(tmp_path, kind):
    master, clock = make_master(tmp_path)
    form(master, clock, ["w0"])
    task = master.get_task(pb.GetTaskRequest(worker_id="w0", round_id=0, task_index=0, position=pos(0))).task
    master.report_task(pb.ReportTaskRequest(worker_id="w0", task_id=task.task_id, ok=False, error="x",
                                            failure=pb.Failure(kind=kind, exception="E", message="bad")))
    assert master.phase is Phase.FAILED and master.failure.kind.value == kind


def test_messages_on_kubernetes_name_spec_fields_not_flags():
    from flextrain.master.failures import in_spec_words

    text = ("fewer than the minimum of 2 (--min-workers); --model-def 'x.py:M' not found; "
            "--no-preflight skips it; resume with `flextrain train --resume d --epochs 3`")
    assert in_spec_words(text) == (
        "fewer than the minimum of 2 (spec.replicaSpecs.worker.minReplicas); spec.modelDef 'x.py:M' not found; "
        "spec.training.preflight: false skips it; resume with `flextrain train --resume d --epochs 3`")
