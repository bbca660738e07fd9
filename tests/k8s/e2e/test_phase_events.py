"""A quick ElasticJob (real master and workers) gets each phase Event exactly once.

The job trains one epoch of digits at full speed, so it may go Pending ->
Running -> Succeeded between two looks of the operator; ``JobRunning`` must
be there all the same, and no phase reported twice.
"""

from __future__ import annotations

import json

import pytest
from ft_helpers import wait_for
from test_elasticjob_e2e import elasticjob, wait_phase

pytestmark = pytest.mark.e2e

LAST_HANDLED = "kopf.zalando.org/last-handled-configuration"


def test_a_quick_job_reports_every_phase_once(operator, node_agent, jobs, digits_data, tmp_path):
    jobs.create(elasticjob("quick", digits_data, tmp_path / "quick", epochs=1, replicas=1))
    wait_phase(jobs, node_agent, "quick", "Succeeded", timeout=300)

    def handled_phase():
        annotations = jobs.get("quick")["metadata"].get("annotations") or {}
        return (json.loads(annotations.get(LAST_HANDLED) or "{}").get("status") or {}).get("phase")

    wait_for(lambda: handled_phase() == "Succeeded", timeout=30, what="the operator to handle Succeeded")
    phases = [r for r in jobs.reasons("quick") if r in ("JobPending", "JobRunning", "JobSucceeded", "JobFailed")]
    assert phases == ["JobPending", "JobRunning", "JobSucceeded"]
