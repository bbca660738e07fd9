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
