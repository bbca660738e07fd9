"""An ElasticJob's inline batch-size trace is checked by the operator: a bad one fails the job with
InvalidSpec naming the line, before any pod starts; a good one (with its LR rule) starts the master."""

from __future__ import annotations

from ft_helpers import wait_for
from test_operator_create import elasticjob


def test_a_bad_inline_trace_fails_the_job_naming_its_line_before_any_pod(operator, jobs):
    job = elasticjob("badtrace")
    job["spec"]["training"].update(batchSchedule="step,batchsize\n0,64\n1,sixty\n", lrRule="linear")
    jobs.create(job)
    status = wait_for(lambda: jobs.status("badtrace").get("phase") == "Failed" and jobs.status("badtrace"),
                      timeout=30, what="the job to fail")
    assert status["message"] == "spec.training.batchSchedule: line 3: batchsize: 'sixty' is not an integer"
    (event,) = [e for e in jobs.events("badtrace") if e["reason"] == "InvalidSpec"]
    assert event["type"] == "Warning" and "line 3" in event["message"]
    assert jobs.master_pods("badtrace") == {} and jobs.service("badtrace") is None


def test_a_good_trace_and_rule_start_the_master(operator, jobs):
    job = elasticjob("goodtrace")
    job["spec"]["training"].update(batchSchedule="step,batchsize\n0,32\n1,64\n", lrRule="sqrt",
                                   referenceBatchSize=32)
    jobs.create(job)
    wait_for(lambda: jobs.master_pods("goodtrace"), timeout=30, what="the master pod")
    assert "InvalidSpec" not in jobs.reasons("goodtrace")
