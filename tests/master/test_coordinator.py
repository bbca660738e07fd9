"""JobMaster driven directly (no gRPC): rendezvous rounds, lockstep tasks, settlement, outcome."""

from __future__ import annotations

import math

import pytest

from flextrain.data import Shard
from flextrain.job import JobSpec, Strategy
from flextrain.master.status import active_workers, records_done, training_loss
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.ledger import TaskLedger
from flextrain.master.rendezvous import RoundState
from flextrain.proto import flextrain_pb2 as pb

G = 10
JOIN = pb.JoinRendezvousResponse
TASK = pb.GetTaskResponse


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_master(tmp_path, *, shards=None, eval_shards=None, steps_per_task=2, epochs=1, retries=3, **spec_kw):
    spec = JobSpec.of(
        name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
        global_batch_size=G, steps_per_task=steps_per_task, epochs=epochs, max_task_retries=retries,
        **spec_kw,
    ).validate()
    ledger = TaskLedger(
        shards=shards or [Shard("s.rio", 0, 40)], epochs=epochs, global_batch_size=G,
        steps_per_task=steps_per_task, max_retries=retries, evaluation_shards=eval_shards,
        renew_ids=spec.strategy is not Strategy.PARAMETER_SERVER,  # as build_ledger
    )
    clock = Clock()
    return JobMaster(spec, ledger, clock=clock), clock


def pos(round_id=-1, task_index=0, steps_done=0, version=0) -> pb.Position:
    return pb.Position(round_id=round_id, task_index=task_index, steps_done=steps_done, version=version)


def join(master, wid, position=None):
    return master.join(wid, position or pos(), wait=0)


def get(master, wid, round_id, index, position=None):
    return master.get_task(pb.GetTaskRequest(
        worker_id=wid, round_id=round_id, task_index=index,
        position=position or pos(round_id, index)))


def get_eval(master, wid):
    return master.get_task(pb.GetTaskRequest(worker_id=wid, round_id=-1, kind=pb.Task.EVALUATION,
                                             position=pos()))


def heartbeat(master, wid, position, loss=math.nan, samples=0):
    return master.heartbeat(pb.HeartbeatRequest(worker_id=wid, position=position, loss=loss, samples=samples))


def report(master, wid, task_id, ok=True, **kw):
    master.report_task(pb.ReportTaskRequest(worker_id=wid, task_id=task_id, ok=ok, **kw))


def final_checkpoint(master, wid, position=None, path="/jobs/job/checkpoints/final.ckpt"):
    master.report_checkpoint(pb.ReportCheckpointRequest(worker_id=wid, path=path, position=position or pos(),
                                                        final=True))


def form(master, clock, workers, versions=None):
    """Register and join ``workers`` in order; returns the last join's response."""
    for w in workers:
        master.register(w)
    resp = None
    for i, w in enumerate(workers):
        clock.now += 1
        resp = join(master, w, pos(version=(versions or {}).get(w, 0)))
    assert resp.action == JOIN.TRAIN
    return resp


# ---- forming rounds ----------------------------------------------------------------
def test_round_forms_only_when_every_alive_worker_joined(tmp_path):
    master, clock = make_master(tmp_path, workers=3)
    for w in "ABC":
        master.register(w)
    assert join(master, "A").action == JOIN.WAIT
    clock.now += 1
    assert join(master, "B").action == JOIN.WAIT
    assert master.rounds_formed == 0 and master.phase is Phase.PENDING
    assert master.rendezvous.current is None
    clock.now += 1
    resp = join(master, "C")
    assert resp.action == JOIN.TRAIN
    assert (resp.round_id, resp.rank, resp.world_size) == (0, 2, 3)
    assert resp.max_micro_batch == G  # no --max-micro-batch: the whole global batch
    rnd = master.rendezvous.current
    assert rnd.members == ["A", "B", "C"]
    assert master.assigned["A"] is rnd and master.assigned["B"] is rnd
    assert master.rounds_formed == 1 and master.phase is Phase.RUNNING
    assert active_workers(master) == 3


def test_launched_but_silent_worker_holds_the_round_until_timeout(tmp_path):
    master, clock = make_master(tmp_path, workers=3, min_workers=2, max_workers=3, rendezvous_timeout=10.0)
    for w in "ABC":
        master.worker_launched(w)
    clock.now = 0.0
    assert join(master, "A").action == JOIN.WAIT
    clock.now = 1.0
    assert join(master, "B").action == JOIN.WAIT
    clock.now = 9.99
    assert join(master, "B").action == JOIN.WAIT  # C alive, timeout not reached
    clock.now = 10.0  # rendezvous_timeout after the first waiter
    resp = join(master, "B")
    assert resp.action == JOIN.TRAIN and resp.world_size == 2
    assert master.rendezvous.current.members == ["A", "B"]
    assert "C" not in master.assigned


def test_min_workers_not_enough_however_long(tmp_path):
    master, clock = make_master(tmp_path, workers=3, min_workers=2, max_workers=3, rendezvous_timeout=1.0)
    for w in "ABC":
        master.register(w)
    join(master, "A")
    clock.now += 1000
    assert join(master, "A").action == JOIN.WAIT
    assert master.rendezvous.current is None


def test_round_forms_at_once_when_max_workers_wait(tmp_path):
    master, clock = make_master(tmp_path, workers=2, min_workers=1, max_workers=2, rendezvous_timeout=100.0)
    for w in "ABC":
        master.register(w)
    join(master, "A")
    resp = join(master, "B")
    assert resp.action == JOIN.TRAIN and resp.world_size == 2


def test_rank_zero_is_the_most_advanced_joiner(tmp_path):
    master, clock = make_master(tmp_path, workers=3)
    resp = form(master, clock, ["A", "B", "C"], versions={"A": 3, "B": 7, "C": 7})
    rnd = master.rendezvous.current
    assert rnd.members == ["B", "C", "A"]  # version desc, then arrival
    assert rnd.version == 7
    assert (resp.rank, resp.version) == (1, 7)  # C's answer


# ---- lockstep task hand-out ------------------------------------------------------------
def test_members_get_same_task_and_next_index_completes_previous(tmp_path):
    master, clock = make_master(tmp_path, workers=2, eval_shards=[Shard("v.rio", 0, 10)])
    r = form(master, clock, ["A", "B"]).round_id
    a0, b0 = get(master, "A", r, 0), get(master, "B", r, 0)
    assert a0.action == b0.action == TASK.RUN
    assert a0.task == b0.task
    assert (a0.task.source, a0.task.start, a0.task.end, a0.task.global_batch_size) == ("s.rio", 0, 20, G)
    assert a0.task.kind == pb.Task.TRAINING
    assert master.ledger.doing[a0.task.task_id].owner == f"round-{r}"
    assert master.ledger.records_done == 0

    b1 = get(master, "B", r, 1)  # any member asking for i+1 commits task i
    assert b1.action == TASK.RUN and b1.task.task_id != a0.task.task_id
    assert a0.task.task_id not in master.ledger.doing
    assert master.ledger.records_done == 20
    assert get(master, "A", r, 1).task == b1.task

    assert get(master, "A", r, 2).action == TASK.NO_MORE
    assert master.ledger.records_done == 40
    assert get(master, "B", r, 2).action == TASK.NO_MORE
    assert master.phase is Phase.RUNNING  # evaluation still to do


def test_out_of_order_index_and_stale_round(tmp_path):
    master, clock = make_master(tmp_path, workers=1)
    r = form(master, clock, ["A"]).round_id
    with pytest.raises(ValueError, match="out of order"):
        get(master, "A", r, 3)
    assert get(master, "A", r + 5, 0).action == TASK.END_ROUND
    assert get(master, "nobody", r, 0).action == TASK.END_ROUND


def test_records_done_includes_active_round_progress(tmp_path):
    master, clock = make_master(tmp_path, workers=2, steps_per_task=3, shards=[Shard("s.rio", 0, 60)])
    r = form(master, clock, ["A", "B"]).round_id
    get(master, "A", r, 0), get(master, "B", r, 0)
    heartbeat(master, "A", pos(r, 0, 2, 2), loss=0.5, samples=20)
    assert records_done(master) == 20
    assert master.ledger.records_done == 0
    assert master.step == 2
    assert training_loss(master) == 0.5
    master.heartbeat(pb.HeartbeatRequest(worker_id="A", position=pos(r, 0, 3, 3), samples=10))  # no loss: unset
    assert records_done(master) == 30 and training_loss(master) == 0.5  # was NaN: "no loss" read as one
    heartbeat(master, "A", pos(r, 0, 3, 3), loss=math.nan, samples=10)
    assert math.isnan(training_loss(master))  # a NaN loss is one (it went wrong), shown as such


# ---- membership changes ----------------------------------------------------------------
def test_member_exit_closes_round_and_next_round_settles_by_most_advanced(tmp_path):
    master, clock = make_master(tmp_path, workers=3, min_workers=1, max_workers=3, steps_per_task=3,
                                shards=[Shard("s.rio", 0, 60)])
    r = form(master, clock, ["A", "B", "C"]).round_id
    t0 = get(master, "A", r, 0).task
    assert get(master, "B", r, 0).task == get(master, "C", r, 0).task == t0
    assert (t0.start, t0.end) == (0, 30)
    # A committed 1 step of t0, B one more (survivors may differ by a step when a peer dies)
    assert not heartbeat(master, "A", pos(r, 0, 1, 1)).end_round
    heartbeat(master, "B", pos(r, 0, 2, 2))

    master.worker_exited("C")
    assert master.rendezvous.current.state is RoundState.CLOSED
    assert heartbeat(master, "A", pos(r, 0, 1, 1)).end_round
    assert get(master, "A", r, 1).action == TASK.END_ROUND
    assert t0.task_id in master.ledger.doing  # not settled yet, and not completed by asking i+1
    assert master.ledger.records_done == 0

    clock.now += 1
    assert join(master, "A", pos(r, 0, 1, 1)).action == JOIN.WAIT  # B is alive, not yet here
    clock.now += 1
    resp = join(master, "B", pos(r, 0, 2, 2))
    assert resp.action == JOIN.TRAIN
    assert (resp.rank, resp.world_size, resp.version) == (0, 2, 2)  # B is the most advanced
    assert master.rendezvous.current.members == ["B", "A"]
    # settled by B: 2 steps (20 records) applied, [20, 30) requeued at the front: the new round's first
    # task (decided as the round formed: it comes with the join answer)
    assert master.ledger.records_done == 20
    assert t0.task_id not in master.ledger.doing
    assert (resp.first_task.start, resp.first_task.end) == (20, 30)
    assert resp.first_task.task_id != t0.task_id  # a new id: reports naming t0 no longer count
    r2 = resp.round_id
    nxt = get(master, "B", r2, 0, pos(r2, 0, 0, 2))
    assert nxt.action == TASK.RUN and (nxt.task.start, nxt.task.end) == (20, 30)
    assert get(master, "A", r2, 0, pos(r2, 0, 0, 2)).task == nxt.task
    # the rest of the job completes every record exactly once
    assert get(master, "A", r2, 1).task.start == 30
    assert get(master, "A", r2, 2).action == TASK.NO_MORE
    assert master.ledger.records_done == 60
    assert master.phase is Phase.RUNNING  # until rank 0 reports the final checkpoint
    final_checkpoint(master, "B", pos(r2, 2, 0, 5))
    assert master.phase is Phase.SUCCEEDED


def test_round_without_survivors_rolls_back_to_the_start_without_checkpoint(tmp_path):
    master, clock = make_master(tmp_path, workers=1, steps_per_task=3, shards=[Shard("s.rio", 0, 60)])
    r = form(master, clock, ["A"]).round_id
    t0 = get(master, "A", r, 0).task
    get(master, "A", r, 1)  # t0 committed: 30 records applied by A's model
    assert master.ledger.records_done == 30
    heartbeat(master, "A", pos(r, 1, 2, 5))
    master.worker_exited("A")  # its model (every step of it) is gone
    master.register("D")
    resp = join(master, "D")
    assert resp.action == JOIN.TRAIN and resp.version == 0 and resp.restore_checkpoint == ""
    # no survivor and no checkpoint: the ledger starts over, so each record is applied once
    assert master.ledger.records_done == 0
    first = get(master, "D", resp.round_id, 0)
    assert first.action == TASK.RUN and (first.task.start, first.task.end) == (t0.start, t0.end) == (0, 30)
    assert get(master, "D", resp.round_id, 1).task.start == 30
    assert get(master, "D", resp.round_id, 2).action == TASK.NO_MORE
    assert master.ledger.records_done == 60


def test_newcomer_asks_the_round_to_end_at_the_next_boundary(tmp_path):
    master, clock = make_master(tmp_path, workers=2, min_workers=1, max_workers=3)
    r = form(master, clock, ["A", "B"]).round_id
    t0 = get(master, "A", r, 0).task
    get(master, "B", r, 0)
    assert not heartbeat(master, "A", pos(r, 0, 1, 1)).end_round
    master.register("C")
    assert master.rendezvous.current.state is RoundState.CLOSING
    assert heartbeat(master, "A", pos(r, 0, 1, 1)).end_round
    assert heartbeat(master, "B", pos(r, 0, 1, 1)).end_round
    # they finish task 0 and ask for task 1: task 0 is committed, the answer is END_ROUND
    assert get(master, "A", r, 1, pos(r, 1, 0, 2)).action == TASK.END_ROUND
    assert get(master, "B", r, 1, pos(r, 1, 0, 2)).action == TASK.END_ROUND
    assert t0.task_id not in master.ledger.doing and master.ledger.records_done == 20
    assert not master.ledger.doing  # nothing handed out for index 1

    clock.now += 1
    assert join(master, "C").action == JOIN.WAIT  # the old round is closing, not closed
    clock.now += 1
    join(master, "A", pos(r, 1, 0, 2))
    clock.now += 1
    resp = join(master, "B", pos(r, 1, 0, 2))
    assert resp.action == JOIN.TRAIN and resp.world_size == 3
    assert master.rendezvous.current.members == ["A", "B", "C"]
    assert master.ledger.records_done == 20
    r2 = resp.round_id
    assert get(master, "C", r2, 0).task.start == 20


def test_a_worker_scaled_away_joining_after_the_next_round_formed_does_not_end_it(tmp_path):
    """Scale 2 -> 1: A re-forms alone at once; B (slower: a script job's agent ending its script) joins
    after that and is told to stop. Its join asked the new round to end as a straggler's does: a second
    round of the same member, and the script restarted twice."""
    master, clock = make_master(tmp_path, workers=2, min_workers=1, max_workers=3)
    r = form(master, clock, ["A", "B"]).round_id
    master.retire("B")
    assert master.rendezvous.current.state is RoundState.CLOSING
    clock.now += 1
    resp = join(master, "A", pos(r, 0, 0, 0))
    assert resp.action == JOIN.TRAIN and resp.world_size == 1
    clock.now += 1
    assert join(master, "B", pos(r, 0, 0, 0)).action == JOIN.STOP
    assert master.rendezvous.current.round_id == resp.round_id
    assert master.rendezvous.current.state is RoundState.ACTIVE


def test_evaluation_task_of_exited_worker_is_released(tmp_path):
    master, clock = make_master(tmp_path, workers=1, eval_shards=[Shard("v.rio", 0, 10)])
    r = form(master, clock, ["A"]).round_id
    for i in range(3):
        get(master, "A", r, i)
    final_checkpoint(master, "A", pos(r, 2, 0, 4))
    master.register("B")
    e = get_eval(master, "A")
    assert e.action == TASK.RUN and e.task.kind == pb.Task.EVALUATION
    assert get_eval(master, "B").action == TASK.WAIT
    master.worker_exited("A")
    again = get_eval(master, "B")
    assert again.action == TASK.RUN and again.task.task_id == e.task.task_id
    report(master, "B", again.task.task_id, metric_sums={"acc": 5.0}, samples=10)
    assert master.phase is Phase.SUCCEEDED and master.metrics == {"acc": 0.5}


# ---- outcome ---------------------------------------------------------------------------
def test_failed_task_beyond_retry_limit_fails_the_job(tmp_path):
    master, clock = make_master(tmp_path, workers=1, retries=1)
    r = form(master, clock, ["A"]).round_id
    t0 = get(master, "A", r, 0).task
    report(master, "A", t0.task_id, ok=False, steps_done=1, error="CorruptRecordIOError: bad crc")
    assert master.phase is Phase.RUNNING
    assert master.ledger.records_done == 10
    again = get(master, "A", r, 1)
    assert again.action == TASK.RUN
    assert (again.task.start, again.task.end) == (10, 20) and again.task.task_id != t0.task_id
    report(master, "A", again.task.task_id, ok=False, steps_done=0, error="CorruptRecordIOError: bad crc again")
    assert master.phase is Phase.FAILED
    assert "bad crc again" in master.message
    assert "s.rio" in master.message and "[10, 20)" in master.message
    stop = get(master, "A", r, 2)
    assert stop.action == TASK.STOP and "bad crc again" in stop.message
    assert heartbeat(master, "A", pos(r, 2)).stop
    assert join(master, "A", pos(r, 2)).action == JOIN.STOP


def test_a_late_failure_report_does_not_settle_the_retry_of_the_same_records(tmp_path):
    # Both members read the corrupt records and report; A's report requeues the rest, and an ask
    # hands it out again before B's report arrives. B names the failed hand-out, not the retry:
    # its steps_done must not count the retry's records as applied.
    master, clock = make_master(tmp_path, workers=2, shards=[Shard("s.rio", 0, 40)])
    r = form(master, clock, ["A", "B"]).round_id
    t0 = get(master, "A", r, 0).task
    get(master, "B", r, 0)
    report(master, "A", t0.task_id, ok=False, steps_done=1, error="CorruptRecordIOError: bad crc")
    retry = get(master, "A", r, 1).task
    assert (retry.start, retry.end) == (10, 20)
    report(master, "B", t0.task_id, ok=False, steps_done=1, error="CorruptRecordIOError: bad crc")
    assert master.ledger.records_done == 10  # only t0's committed step
    assert retry.task_id in master.ledger.doing and master.ledger.doing[retry.task_id].retries == 1


def test_report_for_settled_task_is_ignored(tmp_path):
    master, clock = make_master(tmp_path, workers=1)
    r = form(master, clock, ["A"]).round_id
    t0 = get(master, "A", r, 0).task
    get(master, "A", r, 1)  # completes t0
    report(master, "A", t0.task_id, ok=False, error="late")
    assert master.ledger.error is None and master.ledger.records_done == 20
    report(master, "A", 12345, ok=True)
    assert master.phase is Phase.RUNNING


def test_training_and_evaluation_complete_job_with_mean_metrics(tmp_path):
    master, clock = make_master(tmp_path, workers=1, eval_shards=[Shard("v.rio", 0, 30)])
    r = form(master, clock, ["A"]).round_id
    assert get_eval(master, "A").action == TASK.WAIT  # training not finished yet
    assert get(master, "A", r, 0).action == TASK.RUN
    heartbeat(master, "A", pos(r, 0, 2, 2), loss=0.25, samples=20)
    assert get(master, "A", r, 1).action == TASK.RUN
    assert get(master, "A", r, 2).action == TASK.NO_MORE
    assert master.ledger.training_finished() and master.phase is Phase.RUNNING
    final_checkpoint(master, "A", pos(r, 2, 0, 4))
    assert master.phase is Phase.RUNNING  # evaluation still to do

    e1 = get_eval(master, "A")
    assert e1.action == TASK.RUN and (e1.task.start, e1.task.end) == (0, 20)
    report(master, "A", e1.task.task_id, metric_sums={"accuracy": 15.0, "loss": 4.0}, samples=20)
    assert master.phase is Phase.RUNNING
    e2 = get_eval(master, "A")
    assert (e2.task.start, e2.task.end) == (20, 30)
    report(master, "A", e2.task.task_id, metric_sums={"accuracy": 9.0, "loss": 2.0}, samples=10)
    assert master.phase is Phase.SUCCEEDED
    assert master.metrics == pytest.approx({"accuracy": 24.0 / 30, "loss": 6.0 / 30})
    assert master.ledger.records_done == 40  # evaluation is not training progress
    assert get_eval(master, "A").action == TASK.STOP
    assert heartbeat(master, "A", pos(r, 2)).stop
    assert training_loss(master) == 0.25


def test_training_only_job_succeeds_without_metrics(tmp_path):
    master, clock = make_master(tmp_path, workers=1)
    r = form(master, clock, ["A"]).round_id
    for i in range(2):
        assert get(master, "A", r, i).action == TASK.RUN
    assert get(master, "A", r, 2).action == TASK.NO_MORE
    assert master.phase is Phase.RUNNING  # the final checkpoint is not saved yet
    final_checkpoint(master, "A", pos(r, 2, 0, 4), path="/x/final.ckpt")
    assert master.final_checkpoint == "/x/final.ckpt"
    assert master.phase is Phase.SUCCEEDED and master.message == "training finished"
    assert master.metrics == {}
    assert master.ledger.records_done == master.ledger.records_total == 40


def test_a_ledger_that_lost_records_fails_the_job_instead_of_passing_for_finished(tmp_path):
    master, clock = make_master(tmp_path, workers=1)
    r = form(master, clock, ["A"]).round_id
    assert get(master, "A", r, 0).action == TASK.RUN
    lost = master.ledger.todo.popleft()  # a bug that drops a task: its records never come back
    assert get(master, "A", r, 1).action == TASK.NO_MORE
    final_checkpoint(master, "A", pos(r, 1, 0, 2), path="/x/final.ckpt")
    assert master.phase is Phase.FAILED
    assert master.message.startswith(f"internal error: training ended with {lost.size} of the job's 40 training "
                                     "records not applied")


# ---- bugs ----------------------------------------------------------------------------
def test_every_member_gets_no_more_even_after_the_job_ended(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    r = form(master, clock, ["A", "B"]).round_id
    for i in range(2):
        get(master, "A", r, i), get(master, "B", r, i)
    assert get(master, "B", r, 2).action == TASK.NO_MORE  # rank 1 asks first
    final_checkpoint(master, "B", pos(r, 2, 0, 4))  # (whoever reports it)
    assert master.phase is Phase.SUCCEEDED
    assert get(master, "A", r, 2).action == TASK.NO_MORE  # rank 0 gets the same answer
    assert get(master, "A", r, 3).action == TASK.STOP  # a new question after the end: STOP


def test_rank_zero_exiting_before_final_checkpoint_fails_the_job(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    r = form(master, clock, ["A", "B"]).round_id
    for i in range(3):
        get(master, "A", r, i), get(master, "B", r, i)
    assert master.ledger.training_finished()
    master.worker_exited("B")  # rank 1 leaving is fine
    assert master.phase is Phase.RUNNING
    master.worker_exited("A")
    assert master.phase is Phase.FAILED
    assert "A" in master.message and "final checkpoint" in master.message


def test_rejoin_after_wait_gets_the_round_formed_meanwhile(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    master.register("A"), master.register("B")
    assert join(master, "A").action == JOIN.WAIT
    b = join(master, "B")
    assert b.action == JOIN.TRAIN
    a = join(master, "A")  # A's next poll after WAIT, same position as before
    assert a.action == JOIN.TRAIN and a.round_id == b.round_id and a.world_size == 2
    assert get(master, "B", b.round_id, 0).action == TASK.RUN


def test_heartbeat_before_adopting_new_round_does_not_end_it(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    form(master, clock, ["A", "B"])
    assert master.rendezvous.current.state is RoundState.ACTIVE
    assert not heartbeat(master, "A", pos(-1)).end_round  # still setting up the new round


def test_straggler_joining_after_timeout_round_gets_it_reformed(tmp_path):
    master, clock = make_master(tmp_path, workers=3, min_workers=2, max_workers=3, rendezvous_timeout=10.0)
    for w in "ABC":
        master.register(w)
    join(master, "A"), join(master, "B")
    clock.now += 10
    r = join(master, "B").round_id
    assert master.rendezvous.current.members == ["A", "B"]
    assert join(master, "C").action == JOIN.WAIT
    assert heartbeat(master, "A", pos(r, 0, 1, 1)).end_round
