"""The worker's heartbeat loop (flextrain/worker/main.py) and the round it reports from
(flextrain/worker/state.py): the master's "your round ended" counts only for that round, and a worker
that moved to another round heartbeats from it at once, so the new round's end reaches it at once."""

from __future__ import annotations

import threading

from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.main import _heartbeat_loop
from flextrain.worker.state import WorkerState
from ft_helpers import wait_for

INTERVAL = 30.0  # a period no test waits out: every wait below ends early or the test fails


class Beats:
    """A master client whose heartbeat answers come from ``answer(call, position)``."""

    def __init__(self, answer):
        self.answer, self.sent, self.second = answer, [], threading.Event()

    def heartbeat(self, position, loss, samples, **kw):
        self.sent.append(pb.Position(round_id=position.round_id))
        if len(self.sent) == 2:
            self.second.set()
        return self.answer(len(self.sent), position)


def test_an_end_for_the_round_left_does_not_end_the_one_adopted_and_the_next_beat_is_sent_from_it_at_once():
    state, done = WorkerState(), threading.Event()

    def answer(call, position):
        if call == 1:  # the training thread moved to round 1 while this poll (for round 0) waited
            state.adopt_round(1)
            return pb.HeartbeatResponse(end_round=True)
        done.set()
        return pb.HeartbeatResponse()

    client = Beats(answer)
    loop = threading.Thread(target=_heartbeat_loop, args=(client, state, INTERVAL, done), daemon=True)
    loop.start()
    state.adopt_round(0)  # its first round: the first heartbeat goes out at once
    assert client.second.wait(INTERVAL / 2)  # at once from round 1, not a period later
    loop.join(INTERVAL / 2)
    assert [p.round_id for p in client.sent] == [0, 1]
    assert not state.end_round.is_set()  # round 1 goes on


def test_after_an_end_the_next_beat_waits_for_the_next_round_not_a_period():
    state, done = WorkerState(round_id=2), threading.Event()
    answers = iter([pb.HeartbeatResponse(end_round=True), pb.HeartbeatResponse()])

    def answer(call, position):
        if call == 2:
            done.set()
        return next(answers)

    client = Beats(answer)
    loop = threading.Thread(target=_heartbeat_loop, args=(client, state, INTERVAL, done), daemon=True)
    loop.start()
    state.adopt_round(3)
    wait_for(lambda: state.end_round.is_set(), timeout=INTERVAL / 2, what="round 3's end")
    assert not client.second.wait(0.2)  # still in round 3: nothing new to say
    state.adopt_round(4)  # the rendezvous answered: round 4
    assert not state.end_round.is_set()
    assert client.second.wait(INTERVAL / 2)
    loop.join(INTERVAL / 2)
    assert [p.round_id for p in client.sent] == [3, 4]


def test_an_end_for_the_current_round_ends_it():
    state = WorkerState(round_id=2)
    state.round_ended(1)
    assert not state.end_round.is_set()
    state.round_ended(2)
    assert state.end_round.is_set()
    assert state.wait_round_after(1, 0.0) and not state.wait_round_after(2, 0.0)
