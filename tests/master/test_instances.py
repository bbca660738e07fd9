"""InstanceManager: keeps the desired count; scaling down retires the newest workers first."""

from __future__ import annotations

from flextrain.master.instances import InstanceManager
from flextrain.master.launcher import LaunchBackend


class Backend(LaunchBackend):
    def __init__(self) -> None:
        super().__init__()
        self.live: set[str] = set()
        self.terminated: list[str] = []

    def launch(self, spec) -> None:
        self.live.add(spec.instance_id)

    def terminate(self, instance_id: str, *, force: bool = False) -> None:
        self.terminated.append(instance_id)

    def running(self) -> set[str]:
        return set(self.live)

    def close(self, *, grace: float = 5.0) -> None:
        pass

    def exit(self, instance_id: str, code: int) -> None:
        self.live.discard(instance_id)
        self._on_exit(instance_id, code)


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
