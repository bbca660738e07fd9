"""A member's report that a peer of its round exited (JoinRendezvousRequest.exited_peers, seen by the
worker's peer watch before the kernel has torn the peer down): the master takes the peer as gone at
once, so the survivors' round forms when they have joined, without the launcher's exit report; the
report that follows changes nothing of the new round. A report about a worker the reporter shares no
round with is ignored."""

from __future__ import annotations

from test_coordinator import JOIN, form, make_master, pos

from flextrain.master.rendezvous import RoundState


def test_the_survivors_round_forms_on_their_report_before_the_launcher_sees_the_exit(tmp_path):
    master, clock = make_master(tmp_path, workers=3, min_workers=1, max_workers=3)
    r = form(master, clock, ["A", "B", "C"]).round_id
    clock.now += 1
    first = master.join("A", pos(r, 0, 1, 1), wait=0, exited=["C"])
    assert first.action == JOIN.WAIT  # B is alive and not here yet
    assert "C" not in master.alive and master.rendezvous.current.state is RoundState.CLOSED
    clock.now += 0.5
    resp = master.join("B", pos(r, 0, 1, 1), wait=0, exited=["C"])  # B saw it too: no harm
    assert resp.action == JOIN.TRAIN and resp.world_size == 2
    new = master.rendezvous.current
    assert sorted(new.members) == ["A", "B"] and master.round_history[-1]["recoverySeconds"] == 0.5
    master.worker_exited("C")  # the launcher's waitpid, later
    assert master.rendezvous.current is new and new.state is RoundState.ACTIVE


def test_a_report_about_a_worker_outside_the_reporters_round_is_ignored(tmp_path):
    master, clock = make_master(tmp_path, workers=2, min_workers=1, max_workers=3)
    r = form(master, clock, ["A", "B"]).round_id
    master.register("D")  # registered, waiting to be let in: not a peer of A's round
    clock.now += 1
    master.join("A", pos(r, 0, 1, 1), wait=0, exited=["D", "nobody"])
    assert "D" in master.alive and "B" in master.alive
