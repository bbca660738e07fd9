"""GetTask ``ahead``: the next task is handed out while the current one runs, and
tasks are committed by positions, never by the early ask itself."""

from __future__ import annotations

from test_coordinator import TASK, final_checkpoint, form, get, heartbeat, join, make_master, pos

from flextrain.data import Shard
from flextrain.master.coordinator import Phase
from flextrain.master.rendezvous import RoundState
from flextrain.proto import flextrain_pb2 as pb

JOIN = pb.JoinRendezvousResponse


def ahead(master, wid, round_id, index, position, count=0):
    return master.get_task(pb.GetTaskRequest(worker_id=wid, round_id=round_id, task_index=index,
                                             position=position, ahead=True, ahead_count=count))


def starts(resp):
    return [resp.task.start] + [t.start for t in resp.more]


def test_ahead_answer_runs_the_next_task_without_committing_the_current(tmp_path):
    master, clock = make_master(tmp_path, workers=2, shards=[Shard("s.rio", 0, 60)])  # 3 tasks of 2 steps
    r = form(master, clock, ["A", "B"]).round_id
    t0 = get(master, "A", r, 0).task
    assert get(master, "B", r, 0).task == t0

    early = ahead(master, "A", r, 1, pos(r, 0, 1, 1))  # asked during task 0's last step
    assert early.action == TASK.RUN and early.task.start == 20
    assert t0.task_id in master.ledger.doing and master.ledger.records_done == 0  # not committed
    assert early.task.task_id in master.ledger.doing
    # every member gets the same answer for index 1, asked ahead or not
    assert ahead(master, "B", r, 1, pos(r, 0, 1, 1)).task == early.task
    assert get(master, "B", r, 1).task == early.task

    # the plain ask for 1 (position (1, 0)) committed task 0; a heartbeat would have done it as well
    assert t0.task_id not in master.ledger.doing and master.ledger.records_done == 20
    heartbeat(master, "A", pos(r, 1, 1, 3))
    assert master.ledger.records_done == 20  # task 1 is still running


def test_a_position_past_a_task_commits_it(tmp_path):
    master, clock = make_master(tmp_path, workers=1, shards=[Shard("s.rio", 0, 60)])
    r = form(master, clock, ["A"]).round_id
    t0 = get(master, "A", r, 0).task
    t1 = ahead(master, "A", r, 1, pos(r, 0, 1, 1)).task
    heartbeat(master, "A", pos(r, 1, 0, 2))  # the worker moved on to task 1 with the ahead answer
    assert t0.task_id not in master.ledger.doing and master.ledger.records_done == 20
    t2 = ahead(master, "A", r, 2, pos(r, 1, 1, 3)).task
    assert t1.task_id in master.ledger.doing
    # no task left to hand out early: WAIT, and nothing is decided for index 3
    assert ahead(master, "A", r, 3, pos(r, 2, 1, 5)).action == TASK.WAIT
    assert len(master.rendezvous.current.answers) == 3
    assert master.ledger.records_done == 40  # the ahead ask's position committed task 1
    assert t2.task_id in master.ledger.doing
    assert get(master, "A", r, 3).action == TASK.NO_MORE  # the plain ask commits task 2
    assert master.ledger.records_done == 60
    final_checkpoint(master, "A", pos(r, 3, 0, 6))
    assert master.phase is Phase.SUCCEEDED


def test_ahead_decides_nothing_but_a_task(tmp_path):
    master, clock = make_master(tmp_path, workers=2, min_workers=1, max_workers=3, shards=[Shard("s.rio", 0, 60)])
    r = form(master, clock, ["A", "B"]).round_id
    get(master, "A", r, 0)
    master.register("C")  # a newcomer: the round is closing
    assert master.rendezvous.current.state is RoundState.CLOSING
    assert ahead(master, "A", r, 1, pos(r, 0, 1, 1)).action == TASK.WAIT
    assert len(master.ledger.doing) == 1
    assert get(master, "A", r, 1).action == TASK.END_ROUND  # the plain ask gives the real answer

    master2, clock2 = make_master(tmp_path / "stopping", workers=1, shards=[Shard("s.rio", 0, 60)])
    r2 = form(master2, clock2, ["A"]).round_id
    get(master2, "A", r2, 0)
    master2.request_stop("user asked")
    assert ahead(master2, "A", r2, 1, pos(r2, 0, 1, 1)).action == TASK.WAIT
    assert get(master2, "A", r2, 1).action == TASK.STOP


def test_round_ending_after_an_ahead_answer_requeues_that_task_whole(tmp_path):
    master, clock = make_master(tmp_path, workers=2, min_workers=1, max_workers=2, shards=[Shard("s.rio", 0, 60)])
    r = form(master, clock, ["A", "B"]).round_id
    t0 = get(master, "A", r, 0).task
    get(master, "B", r, 0)
    t1 = ahead(master, "A", r, 1, pos(r, 0, 1, 1)).task
    heartbeat(master, "A", pos(r, 0, 2, 2))  # task 0's last step committed
    master.worker_exited("B")  # before anyone started task 1
    assert master.rendezvous.current.state is RoundState.CLOSED
    heartbeat(master, "A", pos(r, 1, 0, 2))  # a late position from the closed round commits nothing
    assert t0.task_id in master.ledger.doing

    clock.now += 1
    resp = join(master, "A", pos(r, 0, 2, 2))
    assert resp.action == JOIN.TRAIN
    # settled by A: task 0 done (both steps), task 1 back whole: the new round's first task (decided as
    # the round formed, in the join answer), the only task taken
    assert master.ledger.records_done == 20
    r2 = resp.round_id
    assert (resp.first_task.start, resp.first_task.end) == (t1.start, t1.end) == (20, 40)
    assert [t.owner for t in master.ledger.doing.values()] == [f"round-{r2}"]
    assert get(master, "A", r2, 0, pos(r2, 0, 0, 2)).task == resp.first_task


def test_an_ahead_ask_takes_several_tasks_and_every_member_gets_the_same(tmp_path):
    master, clock = make_master(tmp_path, workers=2, shards=[Shard("s.rio", 0, 120)])  # 6 tasks of 2 steps
    r = form(master, clock, ["A", "B"]).round_id
    get(master, "A", r, 0)
    get(master, "B", r, 0)

    taken = ahead(master, "A", r, 1, pos(r, 0, 1, 1), count=3)
    assert taken.action == TASK.RUN and starts(taken) == [20, 40, 60]
    assert len(master.ledger.doing) == 4 and master.ledger.records_done == 0  # nothing committed
    # B's answers for indices 1..3 are A's, however B asks for them
    b1 = ahead(master, "B", r, 1, pos(r, 0, 1, 1), count=2)
    assert [b1.task] + list(b1.more) == [taken.task, taken.more[0]]
    assert get(master, "B", r, 2).task == taken.more[0]
    # asking from index 3 for three: index 3 was decided, 4 and 5 are decided now
    b3 = ahead(master, "B", r, 3, pos(r, 2, 1, 5), count=3)
    assert b3.task == taken.more[1] and starts(b3) == [60, 80, 100]
    assert get(master, "A", r, 4).task == b3.more[0]
    assert ahead(master, "A", r, 6, pos(r, 5, 1, 11), count=4).action == TASK.WAIT  # the epoch is handed out
    assert len(master.rendezvous.current.answers) == 6


def test_round_ending_settles_the_tasks_taken_ahead_and_not_started(tmp_path):
    master, clock = make_master(tmp_path, workers=2, min_workers=1, max_workers=2, shards=[Shard("s.rio", 0, 120)])
    r = form(master, clock, ["A", "B"]).round_id
    get(master, "A", r, 0)
    get(master, "B", r, 0)
    assert starts(ahead(master, "A", r, 1, pos(r, 0, 1, 1), count=4)) == [20, 40, 60, 80]
    heartbeat(master, "A", pos(r, 1, 1, 3))  # task 0 done, task 1 one step in
    assert master.ledger.records_done == 20
    master.worker_exited("B")
    assert master.rendezvous.current.state is RoundState.CLOSED

    clock.now += 1
    resp = join(master, "A", pos(r, 1, 1, 3))
    assert resp.action == JOIN.TRAIN
    # settled by A: task 1's first step counts, its second step and tasks 2-4 go back whole
    assert master.ledger.records_done == 30
    (given,) = master.ledger.doing.values()  # the new round's first task, decided as it formed
    assert given.owner == f"round-{resp.round_id}" and (given.start, given.end) == (resp.first_task.start,
                                                                                   resp.first_task.end)
    assert sorted((t.start, t.end) for t in [given, *master.ledger.todo]) == [(30, 40), (40, 60), (60, 80),
                                                                             (80, 100), (100, 120)]
    # the next round trains exactly the rest, taking it ahead in one ask
    r2 = resp.round_id
    first = get(master, "A", r2, 0, pos(r2, 0, 0, 3))
    rest = ahead(master, "A", r2, 1, pos(r2, 0, 0, 3), count=8)
    assert sorted([(first.task.start, first.task.end)] + [(t.start, t.end) for t in [rest.task, *rest.more]]) == [
        (30, 40), (40, 60), (60, 80), (80, 100), (100, 120)]
    assert get(master, "A", r2, 5).action == TASK.NO_MORE
    assert master.ledger.records_done == 120


def test_a_plain_ask_with_a_count_takes_the_free_tasks_after_its_own(tmp_path):
    """An epoch's first task can only be asked plainly (the epoch's tasks exist once the last one is
    done); with ``ahead_count`` the answer brings the tasks after it too, decided for the round."""
    master, clock = make_master(tmp_path, workers=2, shards=[Shard("s.rio", 0, 60)])  # 3 tasks of 2 steps
    r = form(master, clock, ["A", "B"]).round_id
    first = master.get_task(pb.GetTaskRequest(worker_id="A", round_id=r, task_index=0, position=pos(r, 0, 0, 0),
                                              ahead_count=5))
    assert first.action == TASK.RUN and starts(first) == [0, 20, 40]  # fewer than asked: all there are
    assert len(master.rendezvous.current.answers) == 3
    assert master.ledger.records_done == 0  # deciding is not committing
    assert get(master, "B", r, 2).task == first.more[1]  # every member gets the same answers
    assert master.ledger.records_done == 40  # (that plain ask's position committed tasks 0 and 1)
    assert get(master, "A", r, 3).action == TASK.NO_MORE
    assert master.ledger.records_done == 60
