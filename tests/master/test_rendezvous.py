"""Rendezvous bookkeeping on its own (no JobMaster)."""

from __future__ import annotations

from flextrain.master.rendezvous import Rendezvous, RoundState
from flextrain.proto import flextrain_pb2 as pb


def pos(version=0, round_id=-1):
    return pb.Position(round_id=round_id, version=version)


def test_ready_needs_min_workers_and_all_alive_or_max_or_timeout():
    rv = Rendezvous(min_workers=2, max_workers=4, timeout=5.0)
    alive = {"a", "b", "c"}
    rv.join("a", pos(), now=0.0)
    assert not rv.ready(alive, 100.0)  # below min_workers, however long we wait
    rv.join("b", pos(), now=1.0)
    assert not rv.ready(alive, 4.99)  # c is alive but not here, timeout not reached
    assert rv.ready(alive, 5.0)  # timeout counts from the first waiter
    rv.join("c", pos(), now=2.0)
    assert rv.ready(alive, 2.0)  # every alive worker is waiting


def test_ready_when_max_workers_waiting():
    rv = Rendezvous(min_workers=1, max_workers=2, timeout=100.0)
    for i, w in enumerate("abc"):
        rv.join(w, pos(version=i), now=0.0)
    assert rv.ready({"a", "b", "c", "d"}, 0.0)
    rnd, used = rv.form(previous_round=None)
    assert rnd.members == ["c", "b"]  # highest versions, capped at max_workers
    assert [w.worker_id for w in used] == ["c", "b"]
    assert set(rv.waiting) == {"a"}


def test_form_orders_by_version_then_arrival():
    rv = Rendezvous(min_workers=1, max_workers=8, timeout=1.0)
    rv.join("z", pos(version=3), now=0.0)
    rv.join("y", pos(version=5), now=1.0)
    rv.join("x", pos(version=5), now=2.0)
    rv.join("w", pos(version=0), now=3.0)
    rnd, _ = rv.form(previous_round=None)
    assert rnd.members == ["y", "x", "z", "w"]
    assert rnd.version == 5 and rnd.round_id == 0
    assert rnd.rank_of("z") == 2 and rnd.world_size == 4
    assert rv.current is rnd and not rv.waiting
    rv.join("y", pos(version=6, round_id=0), now=4.0)
    rnd2, _ = rv.form(previous_round=0)
    assert rnd2.round_id == 1


def test_no_new_round_while_current_not_closed():
    rv = Rendezvous(min_workers=1, max_workers=2, timeout=0.0)
    rv.join("a", pos(), now=0.0)
    rnd, _ = rv.form(previous_round=None)
    rv.join("b", pos(), now=1.0)  # not a member: does not close the round
    assert rnd.state is RoundState.ACTIVE
    assert not rv.ready({"a", "b"}, 50.0)
    rv.request_end()
    assert rnd.state is RoundState.CLOSING
    assert not rv.ready({"a", "b"}, 50.0)
    closed = rv.join("a", pos(round_id=0), now=2.0)  # a member rejoining closes it
    assert closed is rnd and rnd.state is RoundState.CLOSED
    assert rv.ready({"a", "b"}, 2.0)
    rv.request_end()  # no effect on a closed round
    assert rnd.state is RoundState.CLOSED


def test_drop_closes_round_of_member_and_forgets_waiter():
    rv = Rendezvous(min_workers=1, max_workers=3, timeout=0.0)
    rv.join("a", pos(), now=0.0)
    rv.join("b", pos(), now=0.0)
    rnd, _ = rv.form(previous_round=None)
    rv.join("c", pos(), now=1.0)
    assert rv.drop("c") is None and "c" not in rv.waiting
    assert rnd.state is RoundState.ACTIVE
    assert rv.drop("b") is rnd and rnd.state is RoundState.CLOSED
    assert rv.drop("a") is None  # already closed


def test_rejoin_keeps_first_arrival_time():
    rv = Rendezvous(min_workers=2, max_workers=3, timeout=10.0)
    rv.join("a", pos(), now=0.0)
    rv.join("a", pos(), now=8.0)
    rv.join("b", pos(), now=9.0)
    assert rv.ready({"a", "b", "c"}, 10.0)


def test_survivors_of_previous_round_rank_before_workers_from_older_rounds():
    rv = Rendezvous(min_workers=1, max_workers=8, timeout=0.0)
    rv.join("old", pos(version=50, round_id=1), now=0.0)  # back from an older round, state moved past
    rv.join("new", pos(version=0), now=1.0)               # a newcomer
    rv.join("s1", pos(version=40, round_id=3), now=2.0)   # survivors of round 3
    rv.join("s2", pos(version=41, round_id=3), now=3.0)
    rnd, _ = rv.form(previous_round=3)
    assert rnd.members[:2] == ["s2", "s1"]
    assert set(rnd.members[2:]) == {"old", "new"}
    assert rnd.version == 41


def test_drop_waiter_only_forgets_the_waiter():
    rv = Rendezvous(min_workers=1, max_workers=3, timeout=0.0)
    rv.join("a", pos(), now=0.0)
    rnd, _ = rv.form(previous_round=None)
    rv.join("b", pos(), now=1.0)
    rv.drop_waiter("b")
    rv.drop_waiter("a")  # a member, not waiting: nothing happens to the round
    assert not rv.waiting and rnd.state is RoundState.ACTIVE
