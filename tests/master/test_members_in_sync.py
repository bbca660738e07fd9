"""A round whose members all hold its starting state already starts without a state broadcast.

The master tells the round so (``JoinRendezvousResponse.members_in_sync``) only when every member
is a survivor of the last round that finished that round's state sync (``Position.synced``) and
stands at the round's version; a newcomer, a straggler from an older round, a member at another
version, one that never finished its sync, or a checkpoint to restore each mean a broadcast.
"""

from __future__ import annotations

from flextrain.data import Shard
from flextrain.master.rendezvous import Rendezvous, members_in_sync
from flextrain.proto import flextrain_pb2 as pb
from test_coordinator import form, heartbeat, join, make_master, pos

JOIN = pb.JoinRendezvousResponse


def synced(round_id, version, *, task_index=0, steps_done=0):
    return pb.Position(round_id=round_id, task_index=task_index, steps_done=steps_done, version=version,
                       synced=True)


def rounds_of(positions, *, previous_id=0):
    """Form a round after a round ``previous_id`` from waiters at ``positions`` (worker -> Position)."""
    rv = Rendezvous(min_workers=1, max_workers=8, timeout=0.0)
    rv.next_round_id = previous_id
    for w in ("p", "q"):  # the previous round
        rv.join(w, pos(), now=0.0)
    previous, _ = rv.form(previous_round=None)
    for i, (w, p) in enumerate(positions.items()):
        rv.join(w, p, now=1.0 + i)
    return rv.form(previous_round=previous.round_id), previous


def test_survivors_synced_at_the_same_version_are_in_sync():
    (rnd, waiters), previous = rounds_of({"a": synced(0, 7, steps_done=3), "b": synced(0, 7, steps_done=3)})
    assert rnd.version == 7 and members_in_sync(rnd, previous, waiters)


def test_any_member_not_holding_the_round_state_means_a_broadcast():
    cases = {
        "a newcomer": pos(),  # round -1, never synced (version 0, below the survivors')
        "a newcomer at the same version": pb.Position(round_id=-1, version=7),
        "a member back from an older round": synced(-3, 7),
        "a member one step behind": synced(0, 6),
        "a member that never finished the last sync": pb.Position(round_id=0, version=7),
    }
    for what, other in cases.items():
        (rnd, waiters), previous = rounds_of({"a": synced(0, 7), "b": other})
        assert not members_in_sync(rnd, previous, waiters), what


def test_the_first_round_and_a_restore_are_never_in_sync():
    rv = Rendezvous(min_workers=1, max_workers=8, timeout=0.0)
    rv.join("a", synced(0, 7), now=0.0)
    rnd, waiters = rv.form(previous_round=None)
    assert not members_in_sync(rnd, None, waiters)
    (rnd, waiters), previous = rounds_of({"a": synced(0, 7), "b": synced(0, 7)})
    rnd.restore_checkpoint = "/jobs/j/checkpoints/ckpt-000000007.ckpt"
    assert not members_in_sync(rnd, previous, waiters)


def test_the_master_answers_in_sync_after_a_failure_and_not_when_a_newcomer_joins(tmp_path):
    master, clock = make_master(tmp_path, workers=3, min_workers=1, max_workers=4, steps_per_task=3,
                                shards=[Shard("s.rio", 0, 600)])
    first = form(master, clock, ["A", "B", "C"])
    assert not first.members_in_sync  # the first round: every member gets rank 0's state
    r = first.round_id
    heartbeat(master, "A", synced(r, 2, steps_done=2))
    master.worker_exited("C")  # killed: A and B, synced at version 2, re-form
    clock.now += 1
    assert join(master, "A", synced(r, 2, steps_done=2)).action == JOIN.WAIT
    clock.now += 1
    two = join(master, "B", synced(r, 2, steps_done=2))
    assert (two.action, two.world_size, two.version, two.members_in_sync) == (JOIN.TRAIN, 2, 2, True)
    assert join(master, "A", synced(r, 2, steps_done=2)).members_in_sync  # the same answer to every member
    # a replacement registers: the survivors leave at a step boundary, and the newcomer needs the state
    r2 = two.round_id
    master.register("D")
    clock.now += 1
    join(master, "A", synced(r2, 4, steps_done=2))
    clock.now += 1
    join(master, "B", synced(r2, 4, steps_done=2))
    clock.now += 1
    three = join(master, "D")
    assert (three.action, three.world_size, three.members_in_sync) == (JOIN.TRAIN, 3, False)
    assert not join(master, "A", synced(r2, 4, steps_done=2)).members_in_sync
