"""`flextrain train --backend kubernetes` with the shared-cluster flags (docs/shared-cluster.md)."""

from __future__ import annotations

import yaml
from test_cli_k8s import TRAIN

from flextrain.k8s.resource import jobspec_from_resource


def test_shared_cluster_flags_become_the_elasticjob_fields(cli):
    res = cli(*TRAIN, "--dry-run", "--priority-class-name", "team-core", "--elastic-priority-class-name", "spot",
              "--gang", "kueue", "--queue", "team-a", "--ttl-seconds-after-finished", "600",
              "--active-deadline-seconds", "86400", "--backoff-limit", "2")
    assert res.returncode == 0, res.stderr
    body = yaml.safe_load(res.stdout)
    assert body["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    spec = body["spec"]
    assert spec["suspend"] is True  # --gang kueue: created suspended, Kueue admits it
    assert spec["scheduling"] == {"gang": "kueue", "queue": "team-a"}
    assert spec["replicaSpecs"]["worker"]["priorityClassName"] == "team-core"
    assert spec["replicaSpecs"]["worker"]["elasticPriorityClassName"] == "spot"
    assert (spec["ttlSecondsAfterFinished"], spec["activeDeadlineSeconds"], spec["backoffLimit"]) == (600, 86400, 2)
    assert jobspec_from_resource(body).scheduling.queue == "team-a"


def test_bad_or_local_shared_cluster_flags_are_refused_naming_the_flag(cli):
    res = cli(*TRAIN, "--dry-run", "--gang", "kueue")
    assert res.returncode == 2 and "--gang kueue needs --queue" in res.stderr, res.stderr
    res = cli(*TRAIN, "--dry-run", "--elastic-priority-class-name", "Spot_Class")
    assert res.returncode == 2 and "--elastic-priority-class-name must be a Kubernetes object name" in res.stderr
    local = [a for a in TRAIN if a not in ("--backend", "kubernetes", "--image", "flextrain:test")]
    res = cli(*local, "--ttl-seconds-after-finished", "60")
    assert res.returncode == 2 and "--ttl-seconds-after-finished needs --backend kubernetes" in res.stderr, res.stderr


def test_status_shows_pending_and_preempted_workers_and_why(cli, jobs):
    from test_operator_create import elasticjob

    from flextrain.k8s import meta

    jobs.create(elasticjob("spot"))
    reason = "1 pending (Unschedulable: 0/3 nodes); 1 preempted so far (last worker-2: PreemptionByScheduler)"
    jobs.kube.custom.patch_namespaced_custom_object_status(
        meta.GROUP, meta.VERSION, jobs.namespace, meta.PLURAL, "spot", {"status": {
            "phase": "Running", "workers": {"desired": 3, "active": 2, "pending": 1, "preempted": 1,
                                            "reason": reason}}})
    res = cli("status", "spot", "--namespace", jobs.namespace)
    assert res.returncode == 0, res.stderr
    assert f"workers   2 active / 3 desired, 1 pending, 1 preempted  - {reason}" in res.stdout
