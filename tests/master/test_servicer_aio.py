"""The master's asyncio gRPC server (flextrain/master/servicer.py): JoinRendezvous long polls hold no
thread and wake when the job gives them an answer; the heartbeat period grows with the job's size."""

from __future__ import annotations

import threading
import time

import pytest

from flextrain.data import Shard
from flextrain.job import JobSpec
from flextrain.master.coordinator import JobMaster
from flextrain.master.ledger import TaskLedger
from flextrain.master.main import HEARTBEAT_INTERVAL, heartbeat_interval
from flextrain.master.rendezvous import Rendezvous
from flextrain.master.servicer import HEARTBEAT_LONG_POLL, JOIN_LONG_POLL, SAMPLE_RECORDS, MasterServicer, start_server
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.client import MasterClient
from ft_helpers import wait_for

JOIN = pb.JoinRendezvousResponse


@pytest.fixture
def served(tmp_path):
    def make(workers: int, **spec_kw):
        spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                          global_batch_size=10, steps_per_task=2, workers=workers, **spec_kw).validate()
        ledger = TaskLedger(shards=[Shard("s.rio", 0, 400)], epochs=1, global_batch_size=10, steps_per_task=2,
                            renew_ids=True)
        job = JobMaster(spec, ledger)
        servicer = MasterServicer(job, status_json=lambda: "{}", stop=lambda reason: (False, ""),
                                  scale=lambda n: (False, ""), heartbeat_interval=1.0)
        server, port = start_server(servicer, host="127.0.0.1", port=0, threads=2)
        clients = [MasterClient(f"127.0.0.1:{port}", f"worker-{i}") for i in range(workers)]
        made.append((server, clients))
        return job, servicer, clients

    made = []
    yield make
    for server, clients in made:
        for c in clients:
            c.close()
        server.stop(grace=None)


def join_all(clients, rounds: dict[str, int] | None = None) -> dict[str, pb.JoinRendezvousResponse]:
    """Every client joins (from the round ``rounds`` gives it: none by default) at once; their answers."""
    answers: dict[str, pb.JoinRendezvousResponse] = {}

    def one(c):
        was = (rounds or {}).get(c.worker_id, -1)
        answers[c.worker_id] = c.join(pb.Position(round_id=was), "start" if was < 0 else "end_round")

    threads = [threading.Thread(target=one, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return answers


def test_the_long_polls_of_a_round_are_answered_when_it_forms_not_at_their_timeout(served):
    job, servicer, clients = served(8)
    for c in clients:
        c.register(pid=1)
    started = time.monotonic()
    answers = join_all(clients)
    took = time.monotonic() - started
    assert {a.action for a in answers.values()} == {JOIN.TRAIN}
    assert sorted(a.rank for a in answers.values()) == list(range(8))
    assert {a.world_size for a in answers.values()} == {8}
    assert took < JOIN_LONG_POLL / 2  # woken by the round forming, not by the long poll's end
    assert not servicer._polls  # no poll left behind


def test_a_long_poll_is_woken_by_a_change_from_another_thread(served):
    job, servicer, clients = served(2, min_workers=1)
    for c in clients:
        c.register(pid=1)
    got = {}
    waiter = threading.Thread(target=lambda: got.update(a=clients[0].join(pb.Position(round_id=-1), "start")))
    waiter.start()
    time.sleep(0.3)  # worker-1 is alive and not waiting: no round yet
    assert "a" not in got
    job.worker_exited("worker-1")  # the launch backend's thread: now every worker alive waits
    waiter.join(JOIN_LONG_POLL / 2)
    assert got["a"].action == JOIN.TRAIN and got["a"].world_size == 1


def test_a_round_due_by_the_straggler_timeout_forms_on_time(served):
    job, servicer, clients = served(3, min_workers=2, rendezvous_timeout=0.5)
    for c in clients:
        c.register(pid=1)
    started = time.monotonic()
    answers = join_all(clients[:2])  # worker-2 never joins
    assert {a.action for a in answers.values()} == {JOIN.TRAIN}
    assert {a.world_size for a in answers.values()} == {2}
    assert 0.4 < time.monotonic() - started < 2.5


def test_a_stopping_job_answers_the_waiting_polls_stop(served):
    job, servicer, clients = served(2)
    clients[0].register(pid=1)
    got = {}
    waiter = threading.Thread(target=lambda: got.update(a=clients[0].join(pb.Position(round_id=-1), "start")))
    waiter.start()
    time.sleep(0.3)
    job.request_stop("test")
    waiter.join(JOIN_LONG_POLL / 2)
    assert got["a"].action == JOIN.STOP


def test_heartbeats_and_tasks_over_the_aio_server(served):
    job, servicer, clients = served(2)
    for c in clients:
        c.register(pid=1)
    answers = join_all(clients)
    rid = answers["worker-0"].round_id
    hb = clients[0].heartbeat(pb.Position(round_id=rid), 0.5, 10)
    assert not hb.end_round and not hb.stop
    t0 = clients[0].get_task(round_id=rid, task_index=0, position=pb.Position(round_id=rid))
    t1 = clients[1].get_task(round_id=rid, task_index=0, position=pb.Position(round_id=rid))
    assert t0.action == pb.GetTaskResponse.RUN and t0.task.task_id == t1.task.task_id
    clients[0].report_task(t0.task.task_id, ok=True)
    assert t0.task.task_id not in job.ledger.doing


def test_the_heartbeat_period_grows_past_the_masters_budget():
    assert heartbeat_interval(1) == HEARTBEAT_INTERVAL
    assert heartbeat_interval(500) == HEARTBEAT_INTERVAL
    assert heartbeat_interval(1000) == 2.0


def test_readiness_counts_launched_workers_and_keeps_the_earliest_wait():
    rv = Rendezvous(min_workers=1, max_workers=10, timeout=5.0)
    rv.join("a", pb.Position(round_id=-1), 100.0)
    rv.join("b", pb.Position(round_id=-1), 101.0)
    assert rv.ready({"a", "b"}, 101.0)
    assert not rv.ready({"a", "b"}, 101.0, launched={"c"})  # the first round waits for started workers
    assert rv.due_at() == 105.0 and rv.ready({"a", "b"}, 105.0, launched={"c"})
    rv.drop_waiter("a")
    assert rv.due_at() == 106.0  # the earliest wait left
    rv.join("a", pb.Position(round_id=-1), 102.0)
    assert rv.due_at() == 106.0
    rnd, _ = rv.form(previous_round=None)
    assert rv.due_at() is None and rnd.rank_of("b") == 0 and rnd.rank_of("a") == 1


def test_a_heartbeat_long_poll_is_answered_as_its_round_ends_for_a_newcomer(served):
    job, servicer, clients = served(3, min_workers=2, rendezvous_timeout=0.3)
    for c in clients[:2]:
        c.register(pid=1)
    answers = join_all(clients[:2])  # worker-2 is not there yet: a round of 2, once the timeout is up
    assert {a.world_size for a in answers.values()} == {2}
    position = pb.Position(round_id=answers["worker-0"].round_id)
    quiet = clients[0].heartbeat(position, float("nan"), 0, wait=0.2)  # nothing happens: answered after its wait
    assert not (quiet.end_round or quiet.stop or quiet.job_over)
    got = {}
    beat = threading.Thread(target=lambda: got.update(a=clients[0].heartbeat(position, float("nan"), 0,
                                                                            wait=HEARTBEAT_LONG_POLL)))
    beat.start()
    wait_for(lambda: servicer._beats, timeout=30, what="the heartbeat waiting at the master")
    clients[2].register(pid=1)  # a newcomer is ready: the round of 2 ends at its next step boundary
    beat.join(HEARTBEAT_LONG_POLL / 2)  # a hang bound: answered as the round ends, not at the poll's end
    assert got["a"].end_round and not got["a"].stop
    assert not servicer._beats  # no poll left behind


def test_the_job_spec_names_a_sample_of_the_first_training_records(served):
    """What a worker feeds to prepare its steps before it registers (a Keras worker traces them)."""
    _, _, (client,) = served(1)
    got = client.job_spec()
    assert JobSpec.from_json(got.job_spec_json).name == "job"
    assert (got.sample.source, got.sample.start, got.sample.end) == ("s.rio", 0, SAMPLE_RECORDS)


def test_a_worker_has_trained_once_it_reports_a_step_past_its_rounds_start(served):
    """What the instance manager waits for before it launches a spare behind a taken one."""
    job, _, clients = served(2)
    for c in clients:
        c.register(pid=1)
    assert not job.has_trained("worker-0")  # in no round yet
    rid = join_all(clients)["worker-0"].round_id
    clients[0].heartbeat(pb.Position(round_id=rid, version=0), 0.5, 10)
    assert not job.has_trained("worker-0")  # at the round's version: no step committed in it yet
    clients[0].heartbeat(pb.Position(round_id=rid, version=1), 0.5, 10)
    assert job.has_trained("worker-0") and not job.has_trained("worker-1")


def test_a_heartbeat_long_poll_from_a_round_that_is_over_is_answered_as_another_forms(served):
    """The worker is in the newer round by then (a survivor re-formed without its dead peer): it heartbeats
    again from there at once, so that the newer round's end for a newcomer reaches it at once too."""
    job, servicer, clients = served(3, min_workers=2, rendezvous_timeout=0.3)
    for c in clients[:2]:
        c.register(pid=1)
    first = join_all(clients[:2])["worker-0"].round_id
    got = {}
    beat = threading.Thread(target=lambda: got.update(a=clients[0].heartbeat(
        pb.Position(round_id=first), float("nan"), 0, wait=HEARTBEAT_LONG_POLL)))
    beat.start()
    wait_for(lambda: servicer._beats, timeout=30, what="the heartbeat waiting at the master")
    clients[2].register(pid=1)  # the round ends for the newcomer: the poll is answered end_round
    beat.join(HEARTBEAT_LONG_POLL / 2)
    assert got["a"].end_round
    old = pb.Position(round_id=first)
    later = {}
    stale = threading.Thread(target=lambda: later.update(a=clients[1].heartbeat(old, float("nan"), 0,
                                                                               wait=HEARTBEAT_LONG_POLL)))
    answers = join_all(clients, {"worker-0": first, "worker-1": first})  # the next round forms
    stale.start()
    stale.join(HEARTBEAT_LONG_POLL / 2)  # a hang bound: answered at once, not at the poll's end
    assert answers["worker-0"].round_id > first and not stale.is_alive()
    assert not (later["a"].end_round or later["a"].stop)  # nothing to end: the worker is in the new round
    quiet = clients[1].heartbeat(pb.Position(round_id=answers["worker-1"].round_id), float("nan"), 0, wait=0.2)
    assert not quiet.end_round  # from the current round: held for its wait, nothing to tell
