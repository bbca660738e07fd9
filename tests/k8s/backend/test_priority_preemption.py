"""Priority-based elasticity on the emulator: core and elastic PriorityClasses, and a preempted elastic
worker that shrinks the job without spending the relaunch budget, waits Pending, and rejoins.

The node agent plays a full node (``set_capacity``) and the scheduler's preemption (``preempt``:
a ``DisruptionTarget`` condition, then the delete), as a real cluster would do it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ft_helpers import COUNTING_MODEL, counting_data, read_status, seen_counts, wait_for

pytestmark = pytest.mark.e2e
G, RECORDS, EPOCHS = 32, 1408, 4


def test_preempted_elastic_worker_costs_no_budget_waits_pending_and_rejoins(kube_job, node_agent, digits_data,
                                                                           tmp_path):
    data = counting_data(digits_data, tmp_path / "counting")
    calm = tmp_path / "calm"  # slow enough to still train through the test's steps; full speed after them
    env = [{"name": "FT_COUNT_G", "value": str(G)}, {"name": "FT_COUNT_RECORDS", "value": str(RECORDS)},
           {"name": "FT_FEED_DELAY", "value": "0.1"}, {"name": "FT_FEED_DELAY_UNTIL", "value": str(calm)}]
    job = kube_job("spot", model_def=COUNTING_MODEL, training_data=str(data), workers=3, min_workers=1,
                   max_workers=3, epochs=EPOCHS, global_batch_size=G, max_micro_batch=8, learning_rate=0.05,
                   relaunch_budget=0,  # any relaunch charged to the budget would stop relaunching at once
                   priority_class_name="core", elastic_priority_class_name="spot",
                   pod_fields={"replicaSpecs.worker.env": env})
    node_agent.set_capacity(3)
    job.start()
    wait_for(lambda: (s := job.status()).get("workers", {}).get("active") == 3 and s.get("step", 0) > 5,
             timeout=120, what="three workers training")
    classes = {p["metadata"]["name"]: p["spec"].get("priorityClassName") for p in job.raw_pods()}
    assert classes == {"spot-worker-0": "core", "spot-worker-1": "spot", "spot-worker-2": "spot"}

    node_agent.set_capacity(2)  # the node is full once the preempting pod takes the slot
    node_agent.preempt("spot-worker-2")
    # The scheduler's reason shows once the node agent has said it (the pod is Pending from its creation on).
    status = wait_for(lambda: (s := job.status())["workers"].get("pending") == 1
                      and "Unschedulable" in s["workers"].get("reason", "") and s, timeout=60,
                      what="the replacement pending, unschedulable")
    workers = status["workers"]
    assert workers["preempted"] == 1 and workers["desired"] == 3 and status["phase"] == "Running"
    assert "1 pending (Unschedulable: 0/1 nodes are available: node full (2 pods))" in workers["reason"]
    assert "1 preempted so far (last worker-2: PreemptionByScheduler; no relaunch budget spent)" in workers["reason"]
    replacement = {p["metadata"]["name"]: p for p in job.raw_pods()}["spot-worker-3"]
    assert replacement["status"]["phase"] == "Pending" and replacement["spec"]["priorityClassName"] == "spot"
    step = status["step"]
    wait_for(lambda: job.status()["step"] > step + 3 and job.status()["workers"]["pending"] == 1, timeout=60,
             what="training going on with two workers while the replacement waits")

    node_agent.set_capacity(3)  # capacity returns: the replacement starts and joins
    wait_for(lambda: (s := job.status())["workers"]["active"] == 3 and s["workers"]["pending"] == 0
             or s["phase"] != "Running", timeout=120, what="the replacement joined")
    assert job.status()["phase"] == "Running", "the job ended before the replacement joined: slow it down"
    calm.touch()
    assert job.wait() == 0

    final = job.status()
    assert final["phase"] == "Succeeded" and final["workers"]["preempted"] == 1
    events = json.dumps(read_status(Path(job.spec.job_dir))["events"])
    assert "worker-2 was taken away by the cluster (PreemptionByScheduler)" in events
    assert "relaunch budget of 0" not in events  # the budget was never charged
    seen, version = seen_counts(Path(job.spec.job_dir))
    assert version == EPOCHS * RECORDS // G
    assert seen.min().item() == seen.max().item() == EPOCHS  # every record applied exactly once per epoch
