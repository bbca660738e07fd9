"""A worker asks for its next task during the current task's last step (GetTask ``ahead``):
driven against the real master over gRPC on loopback, every record is still trained once."""

from __future__ import annotations

import pytest

from flextrain.data import make_shards
from flextrain.data.digits import write_digits
from flextrain.job import JobSpec
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.main import build_ledger
from flextrain.master.servicer import MasterServicer, start_server
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.client import MasterClient
from flextrain.worker import round_tasks
from flextrain.worker.collective import Collective
from flextrain.worker.module import load_model_def
from flextrain.worker.trainer import AllReduceTrainer, WorkerState
from ft_helpers import MODEL_ZOO

DIGITS = f"{MODEL_ZOO / 'digits_torch.py'}:Model"


@pytest.fixture
def job(tmp_path):
    write_digits(tmp_path / "digits")
    spec = JobSpec.of(name="j", model_def=DIGITS, training_data=str(tmp_path / "digits" / "train"),
                   job_dir=str(tmp_path / "job"), global_batch_size=64, steps_per_task=2, epochs=2,
                   workers=1).validate()
    master = JobMaster(spec, build_ledger(spec))
    servicer = MasterServicer(master, status_json=lambda: "{}", stop=lambda reason: (False, ""),
                              scale=lambda n: (False, ""), heartbeat_interval=0.5)
    server, port = start_server(servicer, host="127.0.0.1", port=0, threads=4)
    client = MasterClient(f"127.0.0.1:{port}", "worker-0")
    yield spec, master, client
    client.close()
    server.stop(grace=None)


def make_trainer(spec, client, state) -> AllReduceTrainer:
    model_def = load_model_def(DIGITS)
    model = model_def.build_model()
    return AllReduceTrainer(spec=spec, model_def=model_def, model=model, optimizer=model_def.build_optimizer(model, 0.1),
                            client=client, collective=Collective(), state=state)


def test_next_task_arrives_ahead_and_every_record_is_trained_once(job, monkeypatch):
    spec, master, client = job
    monkeypatch.setattr(round_tasks, "AHEAD_SECONDS", 1e6)  # once a task is timed, every ask takes MAX_AHEAD
    state = WorkerState()
    trainer = make_trainer(spec, client, state)
    loads = []
    load = trainer.loader._load
    trainer.loader._load = lambda task, start, end: loads.append((task.source, start, end)) or load(
        task, start, end)

    client.register(pid=0)
    joined = client.join(state.position(), "start")
    assert joined.action == pb.JoinRendezvousResponse.TRAIN
    state.round_id = joined.round_id
    try:
        assert trainer.run_round() == pb.GetTaskResponse.NO_MORE
    finally:
        trainer.loader.close()

    ledger = master.ledger
    assert ledger.training_finished() and not ledger.doing
    # every step of both epochs was loaded exactly once, and the ledger counts each record once
    G = spec.training.global_batch_size
    shards = make_shards(spec.data.training)
    steps = [(sh.source, i, min(i + G, sh.end)) for sh in shards for i in range(sh.start, sh.end, G)]
    assert sorted(loads) == sorted(steps * 2)
    assert ledger.records_done == 2 * sum(sh.size for sh in shards)
    assert state.version == len(loads)
    # every task comes ahead but the first, the second epoch's too (its tasks are cut once none of the
    # first is TODO, while its last task runs); plain asks: the first task and the NO_MORE
    per_task = G * spec.training.steps_per_task
    tasks = 2 * sum(-(-sh.size // per_task) for sh in shards)
    asks = trainer.tasks
    assert (asks.tasks_ahead, asks.tasks_asked, asks.handed) == (tasks - 1, 2, 0)
    # these tasks take milliseconds: once one is timed, an ahead ask takes several at once
    # (round_tasks.AHEAD_SECONDS of work), so there are far fewer asks than tasks
    assert asks.ahead_asks < asks.tasks_ahead / 2, (asks.ahead_asks, asks.tasks_ahead)
    # both epochs are fewer than MAX_AHEAD tasks: the ahead ask during the first task takes one (no
    # task timed yet), the one during the second all the rest of both epochs (fewer than asked: the
    # master had no more), and no ahead ask is made after that (it would be answered WAIT)
    assert tasks < round_tasks.MAX_AHEAD
    assert (asks.ahead_asks, asks.tasks_asked) == (2, 2)
    assert master.phase is Phase.RUNNING  # until the final checkpoint is reported


@pytest.mark.parametrize("given", [False, True], ids=["asked-ahead", "with-the-join-answer"])
def test_a_rounds_first_task_is_there_without_a_plain_ask(job, given):
    """``ask_first_task`` (what a worker calls before forming the round's group and syncing state): the
    first task either came with the rendezvous answer (``first_task``, decided as the round formed: nobody
    asks, rank 0 broadcasts nothing) or, without it, rank 0's ahead ask travels meanwhile; either way the
    round's first step starts without a plain ask, and every record is trained once."""
    spec, master, client = job
    state = WorkerState()
    trainer = make_trainer(spec, client, state)
    client.register(pid=0)
    joined = client.join(state.position(), "start")
    assert joined.HasField("first_task") and joined.first_task.start == 0
    state.round_id = joined.round_id
    trainer.ask_first_task(rank=joined.rank, given=joined.first_task if given else None)
    try:
        assert trainer.run_round() == pb.GetTaskResponse.NO_MORE
    finally:
        trainer.loader.close()
    assert master.ledger.training_finished() and not master.ledger.doing
    assert master.ledger.records_done == 2 * sum(sh.size for sh in make_shards(spec.data.training))
    per_task = spec.training.global_batch_size * spec.training.steps_per_task
    tasks = 2 * sum(-(-sh.size // per_task) for sh in make_shards(spec.data.training))
    # asked plainly: only the NO_MORE (the second epoch's tasks come ahead: they are cut while the first's last runs)
    counts = (trainer.tasks.given, trainer.tasks.tasks_ahead, trainer.tasks.tasks_asked)
    assert counts == ((1, tasks - 1, 1) if given else (0, tasks, 1))
