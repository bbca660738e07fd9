"""One ``Job<Phase>`` Event per phase a job entered, those the operator never saw included.

A master writes its status at most once a second, and kopf handles only the
newest state of a job, so the operator may see a job go from Pending straight
to Succeeded or Failed. The status written here is what such a master writes;
kopf's ``last-handled-configuration`` annotation shows when the operator's
phase handler has finished with it.
"""

from __future__ import annotations

import pytest
from ft_helpers import wait_for
from test_operator_create import elasticjob
from test_operator_scale import handled


def phase_events(jobs, name: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in jobs.events(name) if e["reason"].startswith("Job")]


def handled_phase(jobs, name: str) -> str | None:
    return (handled(jobs, name).get("status") or {}).get("phase")


@pytest.mark.parametrize(("final", "trained", "expected"), [
    ("Succeeded", {"step": 23, "progress": {"recordsDone": 1438, "recordsTotal": 1438}}, [
        ("JobRunning", "phase Pending -> Running (seen by the operator only as Pending -> Succeeded)"),
        ("JobSucceeded", "phase Running -> Succeeded: it ended"),
    ]),
    ("Failed", {"step": 3, "progress": {"recordsDone": 192, "recordsTotal": 1438}}, [
        ("JobRunning", "phase Pending -> Running (seen by the operator only as Pending -> Failed)"),
        ("JobFailed", "phase Running -> Failed: it ended"),
    ]),
    ("Failed", {}, [("JobFailed", "phase Pending -> Failed: it ended")]),  # failed before training a step
], ids=["succeeded", "failed-while-training", "failed-before-training"])
def test_phases_passed_unseen_are_reported_once(operator, jobs, final, trained, expected):
    jobs.create(elasticjob("quick"))
    wait_for(lambda: handled_phase(jobs, "quick") == "Pending", timeout=30, what="the operator to see Pending")
    jobs.kube.patch_status(jobs.get("quick"), {"phase": final, "message": "it ended", **trained})
    wait_for(lambda: handled_phase(jobs, "quick") == final, timeout=30, what=f"the operator to see {final}")
    assert phase_events(jobs, "quick") == [
        ("JobPending", "phase None -> Pending: master pod quick-master-0 created"), *expected]
    if final == "Failed":
        assert [e["type"] for e in jobs.events("quick") if e["reason"] == "JobFailed"] == ["Warning"]


def test_a_restarted_operator_that_forgot_what_it_handled_reports_no_phase_twice(k8s_cluster, k8s_api, jobs):
    """kopf records a handled change after its handler ran; an operator that dies in between runs
    the handler again. Each phase Event is keyed by job and phase, so the API server keeps one."""
    from operator_support import Operator

    first = Operator(k8s_api, k8s_cluster.namespace, sweep_interval=1.0).start()
    try:
        jobs.create(elasticjob("quick"))
        wait_for(lambda: handled_phase(jobs, "quick") == "Pending", timeout=30, what="the operator to see Pending")
        jobs.kube.patch_status(jobs.get("quick"), {"phase": "Succeeded", "message": "it ended", "step": 5})
        wait_for(lambda: handled_phase(jobs, "quick") == "Succeeded", timeout=30, what="the operator to see it end")
    finally:
        first.close()
    before = phase_events(jobs, "quick")
    # The record of what was handled is lost: the next operator handles the job as new.
    jobs.patch("quick", {"metadata": {"annotations": {"kopf.zalando.org/last-handled-configuration": None}}})
    second = Operator(k8s_api, k8s_cluster.namespace, sweep_interval=1.0).start()
    try:
        wait_for(lambda: handled_phase(jobs, "quick") == "Succeeded", timeout=30, what="the new operator's handling")
    finally:
        second.close()
    assert [reason for reason, _ in before] == ["JobPending", "JobRunning", "JobSucceeded"]
    assert phase_events(jobs, "quick") == before
