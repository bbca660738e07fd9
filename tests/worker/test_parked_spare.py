"""A spare's parked phase (flextrain/worker/parked.py) against the master's real gRPC server: it waits in
the Park long poll, holding no answer, until the pool takes it (then it goes on to register), and it
exits when the pool closes at the job's end; a job without spares answers STOP at once."""

from __future__ import annotations

import threading

import pytest
from ft_helpers import wait_for

from flextrain.data import Shard
from flextrain.job import JobSpec
from flextrain.master.coordinator import JobMaster
from flextrain.master.ledger import TaskLedger
from flextrain.master.servicer import MasterServicer, start_server
from flextrain.master.spares import SparePool
from flextrain.worker.client import MasterClient
from flextrain.worker.parked import park


@pytest.fixture
def serve(tmp_path):
    made = []

    def make(pool):
        spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                          global_batch_size=10, workers=1).validate()
        job = JobMaster(spec, TaskLedger(shards=[Shard("s.rio", 0, 100)], epochs=1, global_batch_size=10,
                                         steps_per_task=1))
        servicer = MasterServicer(job, status_json=lambda: "{}", stop=lambda reason: (False, ""),
                                  scale=lambda n: (False, ""), heartbeat_interval=1.0, spares=pool)
        server, port = start_server(servicer, host="127.0.0.1", port=0, threads=2)
        client = MasterClient(f"127.0.0.1:{port}", "worker-1")
        made.append((server, client))
        return client

    yield make
    for server, client in made:
        client.close()
        server.stop(grace=None)


def parked(serve):
    """A spare parked in a thread, through the real server: (pool, thread, result list)."""
    pool = SparePool(1)
    pool.launched("worker-1")
    client = serve(pool)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(park(client, pid=4242)), daemon=True)
    thread.start()
    # the poll reaching the server (observed state, not a timing assertion)
    wait_for(lambda: pool.snapshot()["pids"] == [4242], timeout=10, what="the spare parked", interval=0.01)
    assert thread.is_alive() and result == []  # parked: no answer yet
    return pool, thread, result


def test_a_parked_spare_returns_once_taken(serve):
    pool, thread, result = parked(serve)
    assert pool.take() == "worker-1"
    thread.join(10)
    assert result == [True]


def test_a_parked_spare_exits_when_the_pool_closes(serve):
    pool, thread, result = parked(serve)
    pool.close()
    thread.join(10)
    assert result == [False]


def test_a_job_without_spares_answers_stop(serve):
    assert park(serve(None), pid=1) is False
