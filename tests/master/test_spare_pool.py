"""Spare workers' bookkeeping (flextrain/master/spares.py) and the instance manager's use of it: spares
are launched ahead with --spare, are not workers, are taken by a scale-up or a replacement (a new spare
is launched behind), and a spare that dies is relaunched without being charged to the relaunch budget."""

from __future__ import annotations

import pytest

from flextrain.master import instances
from flextrain.master.instances import InstanceManager
from flextrain.master.spares import STOP, TAKEN, SparePool
from ft_helpers import FakeBackend as Backend


def test_pool_answers_a_parked_spare_taken_once_and_stop_after_close():
    pool = SparePool(2)
    changed = []
    pool.listeners.append(lambda: changed.append(1))
    pool.launched("worker-2")
    pool.launched("worker-3")
    assert pool.missing() == 0
    assert pool.park("worker-3", 33) is None  # parked: stays
    assert pool.snapshot() == {"desired": 2, "parked": 1, "starting": 1, "pids": [33], "taken": 0}
    assert pool.take() == "worker-3"  # a parked spare before one still starting
    assert changed
    assert pool.park("worker-3", 33) == TAKEN
    assert pool.park("worker-3", 33) == STOP  # told once; then it is a worker, no longer parked
    assert pool.take() == "worker-2"  # still starting: its first Park answers TAKEN at once
    assert pool.park("worker-2", 22) == TAKEN
    assert pool.take() is None
    assert pool.missing() == 2
    assert pool.park("worker-9", 9) == STOP  # unknown to this pool
    pool.launched("worker-4")
    assert pool.exited("worker-4") == "starting"
    pool.launched("worker-5")
    assert pool.park("worker-5", 5) is None
    pool.close()
    assert pool.park("worker-5", 5) == STOP
    assert pool.take() is None and pool.missing() == 0
    assert pool.exited("worker-5") == "parked"
    assert pool.exited("worker-3") is None  # a taken spare is a worker


def test_pool_refuses_a_negative_count():
    with pytest.raises(ValueError, match="spare workers must be 0 or more"):
        SparePool(-1)


def manager(backend, pool, launched, *, desired=2, budget=1, trained=None):
    return InstanceManager(backend, desired=desired, relaunch_budget=budget, worker_args=lambda w: ("worker", w),
                           worker_env=lambda w: {}, on_launch=launched.append, on_exit=lambda w, c: None,
                           on_budget_exhausted=lambda m: None, on_retire=lambda w: None, spares=pool,
                           trained=trained)


def test_manager_keeps_spares_apart_takes_one_to_scale_up_and_launches_another():
    backend, pool, launched = Backend(), SparePool(1), []
    m = manager(backend, pool, launched)
    m.reconcile()
    assert launched == ["worker-0", "worker-1"]  # spares are not workers: not announced to the job
    assert pool.ids() == {"worker-2"}
    spare = backend.specs["worker-2"]
    assert spare.spare and spare.args == ("worker", "worker-2", "--spare")
    assert not backend.specs["worker-0"].spare
    m.reconcile()  # the spare is not counted as a worker: nothing more is launched
    assert set(backend.specs) == {"worker-0", "worker-1", "worker-2"}
    pool.park("worker-2", 222)
    m.scale(3)
    assert launched[-1] == "worker-2" and backend.promoted == ["worker-2"]
    assert pool.park("worker-2", 222) == TAKEN
    assert pool.ids() == {"worker-3"} and backend.specs["worker-3"].spare  # a new spare behind it


def test_a_killed_worker_is_replaced_by_the_spare_and_a_dead_spare_is_not_charged():
    backend, pool, launched = Backend(), SparePool(1), []
    m = manager(backend, pool, launched, budget=1)
    m.reconcile()
    pool.park("worker-2", 222)
    backend.exit("worker-1", 137)  # SIGKILL: a failure, charged (budget 1 per worker)
    assert m.failures == 1 and not m.budget_exhausted
    assert launched[-1] == "worker-2" and pool.ids() == {"worker-3"}
    assert backend.running() - pool.ids() == {"worker-0", "worker-2"}
    pool.park("worker-3", 333)
    backend.exit("worker-3", 137)  # a parked spare killed: relaunched, not a failure
    assert m.failures == 1 and pool.ids() == {"worker-4"} and backend.specs["worker-4"].spare


def test_spares_that_never_get_ready_are_given_up_after_the_budget_in_a_row():
    backend, pool, launched = Backend(), SparePool(1), []
    m = manager(backend, pool, launched, budget=2)
    m.reconcile()
    for _ in range(3):  # three spares in a row die before they park (a module that cannot load)
        (spare,) = pool.ids()
        backend.exit(spare, 1)
    assert pool.ids() == set() and m.failures == 0
    m.reconcile()
    assert pool.ids() == set()  # not relaunched again
    m.close()
    assert pool.closed


def test_the_spare_behind_a_taken_one_starts_once_the_taken_one_trained(monkeypatch):
    """Its start-up would compete for the CPU with the join it was taken to speed up."""
    backend, pool, launched, trained = Backend(), SparePool(1), [], set()
    m = manager(backend, pool, launched, trained=lambda w: w in trained)
    m.reconcile()
    pool.park("worker-2", 222)
    m.scale(3)
    assert launched[-1] == "worker-2" and pool.ids() == set()  # taken; none launched behind it yet
    m.top_up()
    m.reconcile()
    assert pool.ids() == set()
    trained.add("worker-2")  # its first step committed
    m.top_up()
    assert pool.ids() == {"worker-3"} and backend.specs["worker-3"].spare
    # a taken spare that exits before it trains releases the refill at once
    pool.park("worker-3", 333)
    backend.exit("worker-0", 137)
    assert launched[-1] == "worker-3" and pool.ids() == set()
    backend.exit("worker-3", 0)  # e.g. refused at registration: it leaves, the master replaces it otherwise
    assert pool.ids() == {"worker-4"}

    # one that never trains holds the refill back for REFILL_WAIT at most
    monkeypatch.setattr(instances, "REFILL_WAIT", 0.0)
    backend, pool, launched = Backend(), SparePool(1), []
    m = manager(backend, pool, launched, trained=lambda w: False)
    m.reconcile()
    pool.park("worker-2", 222)
    m.scale(3)
    m.top_up()
    assert launched[-1] == "worker-2" and pool.ids() == {"worker-3"}
