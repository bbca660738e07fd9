"""``spec.suspend`` flipped on a running ElasticJob (through ``flextrain suspend/resume --namespace``): the
operator relays it to the master, which checkpoints, lets every worker pod go and reports Suspended; flipped
back, worker pods run again and the job finishes with every record trained (emulator, operator, node agent)."""

from __future__ import annotations

import pytest
from ft_helpers import wait_for
from test_elasticjob_e2e import RECORDS, SLOW_MODEL, elasticjob, pods_of, run_cli, wait_phase

pytestmark = pytest.mark.e2e

LIVE = ("Pending", "Running")


def test_spec_suspend_releases_the_worker_pods_and_false_brings_them_back(operator, node_agent, jobs, digits_data,
                                                                          tmp_path, k8s_cluster):
    def cli(*args):
        return run_cli(k8s_cluster, jobs, *args)

    job_dir = tmp_path / "digits"
    epochs, calm = 20, tmp_path / "calm"
    jobs.create(elasticjob("digits", digits_data, job_dir, epochs=epochs, model=SLOW_MODEL, calm=calm))
    wait_for(lambda: jobs.status("digits").get("workers", {}).get("active") == 2, timeout=240,
             what="a round of 2 workers")
    first = {p["metadata"]["name"] for p in pods_of(jobs, "digits", "worker")}

    assert "spec.suspend: true" in cli("suspend", "digits")
    status = wait_phase(jobs, node_agent, "digits", "Suspended", timeout=180)
    assert status["workers"]["active"] == 0 and "suspended" in status["message"]
    assert not [p for p in pods_of(jobs, "digits", "worker") if p["status"]["phase"] in LIVE]  # all released
    assert [p["status"]["phase"] for p in pods_of(jobs, "digits", "master")] == ["Running"]  # the master waits
    assert (job_dir / "checkpoints" / "latest.json").is_file()  # the suspend checkpoint
    done = status["progress"]["recordsDone"]
    assert 0 < done < status["progress"]["recordsTotal"]
    assert "phase     Suspended" in cli("status", "digits")

    cli("resume", "digits")
    wait_for(lambda: jobs.status("digits").get("phase") == "Running"
             and len([p for p in pods_of(jobs, "digits", "worker") if p["status"]["phase"] == "Running"
                      and p["metadata"]["name"] not in first]) == 2,
             timeout=240, what="phase Running with two new worker pods")
    calm.touch()
    status = wait_phase(jobs, node_agent, "digits", "Succeeded", timeout=500)
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == epochs * RECORDS
    reasons = jobs.reasons("digits")
    assert "Suspending" in reasons and "Resuming" in reasons
    assert jobs.status("digits")["masterRelaunches"] == 0
