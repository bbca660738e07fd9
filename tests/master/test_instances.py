"""InstanceManager: keeps the desired count; scaling down retires the newest workers first."""

from __future__ import annotations

from flextrain.master.instances import InstanceManager
from ft_helpers import FakeBackend as Backend


def manager(backend, desired, retired):
    return InstanceManager(backend, desired=desired, relaunch_budget=1, worker_args=lambda w: (),
                           worker_env=lambda w: {}, on_launch=lambda w: None, on_exit=lambda w, c: None,
                           on_budget_exhausted=lambda m: None, on_retire=retired.append, retire_grace=60.0)


def test_scaling_down_retires_the_highest_indices_and_an_exit_is_replaced():
    backend, retired = Backend(), []
    m = manager(backend, 12, retired)
    m.reconcile()
    assert backend.live == {f"worker-{i}" for i in range(12)}
    m.scale(9)
    assert retired == ["worker-11", "worker-10", "worker-9"]  # by index, not by name (worker-9 < worker-10)
    for w in retired:
        backend.exit(w, 0)
    backend.exit("worker-3", 137)  # a failure: replaced by a new worker
    assert backend.live == {f"worker-{i}" for i in (0, 1, 2, 4, 5, 6, 7, 8, 12)}
    assert retired == ["worker-11", "worker-10", "worker-9"]


class Preempting(Backend):
    """A backend whose exits may be marked as the cluster taking the instance away (its ``disruption``)."""

    def __init__(self) -> None:
        super().__init__()
        self.disrupted: dict[str, str] = {}

    def disruption(self, instance_id: str) -> str | None:
        return self.disrupted.get(instance_id)


def test_a_preempted_worker_is_replaced_without_spending_the_relaunch_budget():
    backend, exhausted, disrupted = Preempting(), [], []
    m = InstanceManager(backend, desired=3, relaunch_budget=0, worker_args=lambda w: (), worker_env=lambda w: {},
                        on_launch=lambda w: None, on_exit=lambda w, c: None, on_budget_exhausted=exhausted.append,
                        on_retire=lambda w: None, on_disrupted=lambda w, why: disrupted.append((w, why)))
    m.reconcile()
    for victim, new in (("worker-2", "worker-3"), ("worker-1", "worker-4")):
        backend.disrupted[victim] = "PreemptionByScheduler"
        backend.exit(victim, 137)
        assert new in backend.live  # replaced at once, though the budget is 0
    assert (m.failures, m.preempted, m.last_disruption, exhausted) == (0, 2, "worker-1: PreemptionByScheduler", [])
    assert disrupted == [("worker-2", "PreemptionByScheduler"), ("worker-1", "PreemptionByScheduler")]
    backend.exit("worker-0", 137)  # not marked: a failure, over the budget of 0
    assert m.failures == 1 and len(exhausted) == 1 and "worker-5" not in backend.live


def test_pod_disruption_reads_what_kubernetes_marks():
    from flextrain.master.k8s_outcomes import disruption, unscheduled_reason

    cond = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    assert disruption({"status": {"phase": "Failed", "conditions": [cond]}}) == "EvictionByEvictionAPI"
    assert disruption({"status": {"phase": "Failed", "reason": "Evicted"}}) == "Evicted"  # an older kubelet
    assert disruption({"status": {"phase": "Failed", "reason": "Error"}}) is None
    assert disruption({"status": {"conditions": [{**cond, "status": "False"}]}}) is None
    pending = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}]}}
    assert unscheduled_reason(pending) == "Unschedulable: 0/3 nodes"


def test_the_core_is_a_count_of_live_worker_pods():
    from flextrain.master.k8s_priority import PriorityClasses

    classes = PriorityClasses({"spec": {"replicaSpecs": {"worker": {
        "replicas": 4, "minReplicas": 2, "priorityClassName": "core", "elasticPriorityClassName": "spot"}}}})
    assert classes.choose([]) == "core" and classes.choose(["core"]) == "core"
    assert classes.choose(["core", "core"]) == "spot" and classes.choose(["core", "core"], spare=True) == "spot"
    assert classes.choose(["core", "spot", "spot"]) == "core"  # a lost core worker's replacement is core again
    plain = PriorityClasses({"spec": {"replicaSpecs": {"worker": {"replicas": 2, "priorityClassName": "x"}}}})
    assert plain.choose(["x", "x", "x"]) == "x"  # without an elastic class, every worker gets the one
