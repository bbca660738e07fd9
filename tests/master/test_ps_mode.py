"""ParameterServer-mode master logic, driven directly: task hand-out per worker, requeue on
death, outcome; PSFleet launching and relaunching parameter servers through a fake backend."""

from __future__ import annotations

import threading

import pytest

from flextrain.data import Shard
from flextrain.job import JobSpec, Strategy
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.launcher import LaunchBackend, Role
from flextrain.master.ledger import TaskLedger
from flextrain.master.ps_fleet import PSFleet, PSStartError, is_ps
from flextrain.proto import flextrain_pb2 as pb

G = 10
TASK = pb.GetTaskResponse


def make_ps_master(tmp_path, *, records=40, steps_per_task=2, eval_shards=None, workers=2):
    spec = JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                   global_batch_size=G, steps_per_task=steps_per_task, workers=workers,
                   strategy=Strategy.PARAMETER_SERVER, ps=2).validate()
    ledger = TaskLedger(shards=[Shard("s.rio", 0, records)], epochs=1, global_batch_size=G,
                        steps_per_task=steps_per_task, evaluation_shards=eval_shards)
    return JobMaster(spec, ledger)


def ask(master, wid, kind=pb.Task.TRAINING):
    return master.get_task(pb.GetTaskRequest(worker_id=wid, round_id=0, kind=kind,
                                             position=pb.Position(round_id=0)))


def done(master, wid, task, ok=True, steps_done=0):
    master.report_task(pb.ReportTaskRequest(worker_id=wid, task_id=task.task_id, ok=ok, steps_done=steps_done,
                                            error="" if ok else "bad record"))


def test_each_worker_takes_its_own_tasks_without_rendezvous(tmp_path):
    m = make_ps_master(tmp_path)
    a, b = ask(m, "worker-0"), ask(m, "worker-1")
    assert a.action == b.action == TASK.RUN
    assert (a.task.start, a.task.end, b.task.start, b.task.end) == (0, 20, 20, 40)
    assert m.ledger.doing[a.task.task_id].owner == "worker-0"
    assert m.phase is Phase.RUNNING and m.rounds_formed == 0
    # nothing left to hand out, but tasks are in flight: wait (one may come back)
    assert ask(m, "worker-0").action == TASK.WAIT
    done(m, "worker-0", a.task)
    done(m, "worker-1", b.task)
    assert m.ledger.records_done == 40
    assert ask(m, "worker-0").action == TASK.NO_MORE
    assert m.phase is Phase.SUCCEEDED  # no validation data: training done is the job done
    assert m.final_checkpoint == str(tmp_path / "ps-checkpoints")


def test_dead_workers_task_is_requeued_whole_for_another_worker(tmp_path):
    m = make_ps_master(tmp_path)
    a = ask(m, "worker-0")
    m.worker_exited("worker-0")
    assert not m.ledger.doing
    again = ask(m, "worker-1")
    assert (again.task.start, again.task.end) == (a.task.start, a.task.end)
    assert m.ledger.doing[again.task.task_id].owner == "worker-1"


def test_failed_task_keeps_pushed_minibatches_and_retries_the_rest(tmp_path):
    m = make_ps_master(tmp_path)
    a = ask(m, "worker-0")
    done(m, "worker-0", a.task, ok=False, steps_done=1)
    assert m.ledger.records_done == G
    again = ask(m, "worker-1")
    assert (again.task.start, again.task.end) == (a.task.start + G, a.task.end)


def test_evaluation_follows_training_and_then_the_job_succeeds(tmp_path):
    m = make_ps_master(tmp_path, records=20, eval_shards=[Shard("v.rio", 0, 5)])
    t = ask(m, "worker-0")
    assert ask(m, "worker-1", kind=pb.Task.EVALUATION).action == TASK.WAIT
    done(m, "worker-0", t.task)
    assert ask(m, "worker-0").action == TASK.NO_MORE
    e = ask(m, "worker-1", kind=pb.Task.EVALUATION)
    assert e.action == TASK.RUN
    m.report_task(pb.ReportTaskRequest(worker_id="worker-1", task_id=e.task.task_id, ok=True,
                                       metric_sums={"accuracy": 4.0}, samples=5))
    assert m.phase is Phase.SUCCEEDED and m.metrics == {"accuracy": 0.8}


def test_stop_and_retired_workers_get_stop(tmp_path):
    m = make_ps_master(tmp_path)
    m.retire("worker-1")
    assert ask(m, "worker-1").action == TASK.STOP
    m.request_stop("user")
    assert ask(m, "worker-0").action == TASK.STOP


def test_tick_forms_no_rounds_in_ps_mode(tmp_path):
    m = make_ps_master(tmp_path)
    m.register("worker-0")
    m.register("worker-1")
    assert m.tick() == []
    assert m.rendezvous.current is None


# ---- PSFleet ------------------------------------------------------------------
class FakeBackend(LaunchBackend):
    """Records launches; a launched PS "listens" at once by writing its address file."""

    def __init__(self, *, listen: bool = True) -> None:
        super().__init__()
        self.launched, self.terminated, self.listen = [], [], listen
        self._running: set[str] = set()
        self.lock = threading.Lock()

    def launch(self, spec):
        self.launched.append(spec)
        self._running.add(spec.instance_id)
        args = list(spec.args)
        port = int(args[args.index("--port") + 1]) or 5000 + spec.index
        if self.listen:
            path = args[args.index("--address-file") + 1]
            with open(path, "w") as f:
                f.write(f"127.0.0.1:{port}\n")

    def die(self, instance_id, code=137):
        self._running.discard(instance_id)
        self._on_exit(instance_id, code)

    def terminate(self, instance_id, *, force=False):
        self.terminated.append(instance_id)

    def running(self):
        return set(self._running)

    def close(self, *, grace=5.0):
        pass


def fleet_spec(tmp_path, **kw) -> JobSpec:
    return JobSpec.of(name="job", model_def="m.py:Model", training_data="d", job_dir=str(tmp_path),
                   strategy=Strategy.PARAMETER_SERVER, ps=2, **kw).validate()


def test_fleet_launches_every_ps_and_returns_their_addresses(tmp_path):
    backend = FakeBackend()
    fleet = PSFleet(backend, fleet_spec(tmp_path, ps_checkpoint_steps=7, ps_mode="async"), relaunch_budget=2)
    assert fleet.start() == ["127.0.0.1:5000", "127.0.0.1:5001"]
    first = backend.launched[0]
    assert first.role is Role.PS and first.instance_id == "ps-0" and is_ps("ps-0") and not is_ps("worker-0")
    args = list(first.args)
    assert args[args.index("ps") + 1:args.index("ps") + 5] == ["--shard-index", "0", "--num-ps", "2"]
    assert args[args.index("--checkpoint-dir") + 1] == str(tmp_path / "ps-checkpoints")
    assert args[args.index("--checkpoint-every") + 1] == "7"
    assert args[args.index("--mode") + 1] == "async"
    fleet.close()
    assert sorted(backend.terminated) == ["ps-0", "ps-1"]


def test_a_dead_ps_is_relaunched_on_its_port_until_the_budget_is_spent(tmp_path):
    backend = FakeBackend()
    failures = []
    fleet = PSFleet(backend, fleet_spec(tmp_path), relaunch_budget=1, on_failure=failures.append)
    backend.on_exit(fleet.exited)
    fleet.start()
    backend.die("ps-1")
    relaunched = backend.launched[-1]
    assert relaunched.instance_id == "ps-1"
    assert list(relaunched.args)[list(relaunched.args).index("--port") + 1] == "5001"
    assert not failures
    backend.die("ps-1")
    assert len(backend.launched) == 3 and failures and "parameter server 1" in failures[0]
    fleet.close()
    backend.die("ps-0", 0)  # exits after close are expected: no relaunch
    assert len(backend.launched) == 3


def test_a_ps_that_never_listens_is_a_start_error_naming_its_log(tmp_path):
    backend = FakeBackend(listen=False)
    fleet = PSFleet(backend, fleet_spec(tmp_path), relaunch_budget=1, start_timeout=0.2)
    with pytest.raises(PSStartError, match=r"parameter server 0 did not listen.*ps-0\.log"):
        fleet.start()


def test_dead_worker_keeps_the_minibatches_it_reported_as_pushed(tmp_path):
    m = make_ps_master(tmp_path, steps_per_task=3, records=60)
    a = ask(m, "worker-0")
    assert (a.task.start, a.task.end) == (0, 30)
    m.heartbeat(pb.HeartbeatRequest(worker_id="worker-0", position=pb.Position(
        round_id=0, task_index=a.task.task_id, steps_done=2, version=2)))
    m.worker_exited("worker-0")
    assert m.ledger.records_done == 2 * G
    again = ask(m, "worker-1")
    assert (again.task.start, again.task.end) == (2 * G, 30)


def test_a_position_of_another_task_counts_nothing(tmp_path):
    m = make_ps_master(tmp_path, steps_per_task=3, records=60)
    a = ask(m, "worker-0")
    done(m, "worker-0", a.task)
    # the last report still names the finished task, with all its steps
    b = m.get_task(pb.GetTaskRequest(worker_id="worker-0", round_id=0, position=pb.Position(
        round_id=0, task_index=a.task.task_id, steps_done=3)))
    m.worker_exited("worker-0")
    assert m.ledger.records_done == 30
    again = ask(m, "worker-1")
    assert (again.task.start, again.task.end) == (b.task.start, b.task.end)
