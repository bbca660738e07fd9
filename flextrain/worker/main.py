"""The worker process: register, train in rounds, evaluate, exit.

``flextrain worker --master HOST:PORT --worker-id ID`` runs :func:`run_worker`.
The worker gets the JobSpec from the master, loads the model-zoo module,
then loops: join the rendezvous -> form the round's process group -> take the
round's state from rank 0 -> train until the round ends. A failed collective
(a peer died) only ends the round; the process never restarts for it.
With the ParameterServer strategy there are no rounds: ``PSTrainer``
(``ps_trainer.py``) takes tasks on its own and pulls/pushes parameters.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

import torch

from flextrain.data import configure_record_cache
from flextrain.elastic.memory import MemoryMonitor
from flextrain.failures import ExitCode
from flextrain.job import JobSpec, JobType, Strategy
from flextrain.protocol.security import CredentialsError, from_environment
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.client import MasterClient, MasterUnreachable
from flextrain.worker.collective import Collective, CollectiveError
from flextrain.worker.evaluation import evaluate_task
from flextrain.worker.frameworks import make_predictor
from flextrain.worker.failure import describe, failure_of, log_failure, one_line
from flextrain.worker.module import Framework, load_model_def
from flextrain.worker.parked import park
from flextrain.worker.peerwatch import PeerWatch, alive_mark
from flextrain.worker.prediction import load_outputs_processor, predict_task
from flextrain.worker.ps_trainer import PSTrainer
from flextrain.worker.script_agent import run_agent
from flextrain.worker.trainer import AllReduceTrainer, WorkerState

log = logging.getLogger("flextrain.worker")
_KIND_MODE = {pb.Task.TRAINING: "training", pb.Task.EVALUATION: "evaluation", pb.Task.PREDICTION: "prediction"}

EVAL_POLL = 0.2  # seconds between asks while the master has no evaluation task yet
RELEASE_GRACE = 2.0  # seconds blocked in a collective after the job is over before leaving it


def _heartbeat_loop(client: MasterClient, state: WorkerState, interval: float, done: threading.Event) -> None:
    """A heartbeat every ``interval`` seconds, each a long poll of up to ``interval``: the master answers
    it as soon as the round ends (a newcomer waits to join), another round formed (the poll was for one
    that is over), the worker must stop or the job is over. The next heartbeat goes out the moment the
    worker is in a round other than the one the last was sent from (the first: the round it started in),
    else after the rest of the period (a whole period after such an answer, or a failed call)."""
    over_since = None  # since when the master says the job is over while we are blocked in a collective
    pause, sent_round = interval, state.round_id
    while True:  # woken early by a new round, or by ``done`` (set, then the state nudged)
        state.wait_round_after(sent_round, pause, until=done.is_set)
        if done.is_set():
            return
        loss, samples = state.take_loss()
        pause, began = interval, time.monotonic()
        position = state.position()
        sent_round = position.round_id
        try:
            resp = client.heartbeat(position, loss, samples, waiting_for_peers=state.waiting,
                                    stalled_seconds=time.monotonic() - state.progressed,
                                    skipped_steps=state.skipped_steps, lr_gain=state.lr_factor,
                                    gradient_noise_scale=state.noise_scale, memory=state.sample_memory(),
                                    compute=state.take_compute(), ps_traffic=state.traffic.take(), wait=interval)
        except MasterUnreachable as exc:
            log.error("%s", exc)
            state.stop.set()
            return
        except Exception as exc:  # noqa: BLE001 - a lost heartbeat is retried next period
            log.warning("heartbeat failed: %s", describe(exc))
            continue
        if not (resp.end_round or resp.stop or resp.job_over):  # the rest of the period, if any, waited out here
            pause = max(0.0, interval - (time.monotonic() - began))
        if resp.end_round:
            state.round_ended(sent_round)
        if resp.stop:
            state.stop.set()
        blocked = state.waiting and not state.in_rendezvous
        if not (resp.job_over and blocked):
            over_since = None
            continue
        over_since = over_since or time.monotonic()
        # The job is over but our training thread waits in a collective on a peer that will never
        # come (it failed while alive, or left): gloo would hold it for --worker-timeout. Give the
        # normal way out (a broken connection fails it at once) a few steps' time, then leave.
        if time.monotonic() - over_since >= max(RELEASE_GRACE, 3 * state.step_seconds):
            log.error("the job is over but this worker is still blocked in a collective of round %d; exiting "
                      "with code %d instead of waiting out the collective timeout", state.round_id,
                      ExitCode.RELEASED)
            logging.shutdown()
            os._exit(ExitCode.RELEASED)  # gloo cannot abort a collective from another thread


@dataclass
class _Doing:
    """What the worker is doing, for its failure report."""

    stage: str = "starting"
    state: WorkerState | None = None

    @property
    def step(self) -> int:
        return self.state.version if self.state else 0


def run_worker(master: str, worker_id: str, *, spare: bool = False) -> int:
    """Run a worker; returns its exit code (flextrain.failures.ExitCode).

    Whatever ends the worker other than the master's say-so is reported to the master before
    the process exits: the exception, the user's file and line, the traceback. That includes
    ``sys.exit()`` called by the user's code; only a signal or ``os._exit`` go unreported (the
    master then names the exit code and the end of the worker's log).
    """
    try:
        creds = from_environment(server=False)  # --tls: the CA and token its master made (a client's part)
    except CredentialsError as exc:  # no channel to report it on: the line and the exit code say it
        print(f"flextrain: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    client = MasterClient(master, worker_id, creds=creds)
    doing = _Doing()
    try:
        return _run_worker(client, worker_id, doing, spare=spare)
    except MasterUnreachable as exc:
        log.error("%s", exc)
        return ExitCode.MASTER_LOST
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the user's code must not end us silently
        failure = failure_of(exc, stage=doing.stage, step=doing.step)
        log_failure(f"{worker_id} failed while {doing.stage}: {one_line(failure)}", exc)
        try:
            client.report_failure(failure)
        except Exception as report_exc:  # noqa: BLE001 - the exit code still says which kind it was
            log.error("could not report the failure to the master: %s", describe(report_exc))
        return failure.exit_code


def _run_worker(client: MasterClient, worker_id: str, doing: _Doing, *, spare: bool = False) -> int:
    master = client.address
    threads = int(os.environ.get("FLEXTRAIN_NUM_THREADS", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    reg = client.job_spec()
    spec = JobSpec.from_json(reg.job_spec_json)
    if spec.is_script:  # the user's own script, restarted in each round's world
        doing.stage = "running the script"
        return run_agent(client, spec, worker_id=worker_id, heartbeat_interval=reg.heartbeat_interval)
    configure_record_cache(spec.data.record_cache_mb)  # decoded chunks kept for later epochs (off by default)
    model_def = load_model_def(spec.model_def)
    torch.manual_seed(spec.training.seed)
    if model_def.framework is Framework.TENSORFLOW:  # same initial Keras weights in every worker
        from flextrain.worker.tf.checks import seed_tf

        seed_tf(spec.training.seed)
    model = model_def.build_model()
    if spec.job_type is not JobType.TRAINING:
        return _run_inference_job(spec, client, reg, model_def, model, worker_id, doing)
    accelerated = None
    if spec.training.accelerate is not None:  # a training strategy (flextrain/worker/accelerating.py)
        from flextrain.worker.accelerating import accelerate_worker

        doing.stage = "choosing and applying the training strategy (--accelerate)"
        accelerated = accelerate_worker(spec, model_def, model, client)
        model = accelerated.core  # what the optimizer steps and checkpoints hold (plain state_dict keys)
        doing.stage = "starting"
    optimizer = model_def.build_optimizer(model, spec.training.learning_rate)
    state = doing.state = WorkerState()
    if model_def.framework is Framework.PYTORCH:  # sampled for each heartbeat
        state.monitor = MemoryMonitor(device=next((p.device for p in model.parameters()), None), keep=100)
    probe = None
    if spec.training.auto_micro_batch and spec.strategy is Strategy.ALLREDUCE:
        from flextrain.worker.probing import probe_worker

        doing.stage = "probing the largest micro-batch (--max-micro-batch auto)"
        probe = probe_worker(spec, model_def, model, optimizer, compute=accelerated)
        doing.stage = "starting"
    # Evaluation batches: the probed M holds a training step, so it holds a forward without gradients.
    eval_batch = probe.max_micro_batch if probe is not None else spec.training.effective_max_micro_batch
    forward = accelerated.evaluate if accelerated is not None else None  # evaluation under the strategy
    collective: Collective | None = None
    if spec.strategy is Strategy.PARAMETER_SERVER:
        ps_trainer = PSTrainer
        predictor = make_predictor(model_def, model)  # evaluates the model with the PS trainer's embeddings
        if model_def.framework is Framework.TENSORFLOW:
            from flextrain.worker.ps_keras import KerasPSTrainer as ps_trainer
        trainer = ps_trainer(spec=spec, model_def=model_def, model=model, optimizer=optimizer, client=client,
                            state=state, ps_addresses=list(reg.ps_addresses),
                            evaluate=lambda version: _evaluate(spec, client, model_def, predictor, state, version,
                                                               position=state.position(), batch=eval_batch))
    else:
        collective = Collective(timeout=spec.worker.worker_timeout)
        if (mark := alive_mark()) is not None:  # peers see our exit at once, and we theirs (peerwatch.py)
            collective.watch = PeerWatch(mark, worker_id=worker_id, on_exit=collective.peer_exited)
        predictor = make_predictor(model_def, model, forward)
        trainer = AllReduceTrainer(
            spec=spec, model_def=model_def, model=model, optimizer=optimizer, client=client,
            collective=collective, state=state, compute=accelerated,
            evaluate=lambda version: _evaluate(spec, client, model_def, predictor, state, version,
                                               position=state.position(), batch=eval_batch))
    if collective is not None:  # ready for steps of any size before the round can wait for us (Keras: traced)
        doing.stage = "preparing the model's steps"
        trainer.prepare(reg.sample if reg.HasField("sample") else None)
        doing.stage = "starting"
    node_check = None
    if spec.worker.node_check and collective is not None:  # timed before parking: a spare is ready when taken
        from flextrain.worker.nodecheck import check_node

        doing.stage = "checking this node (--node-check)"
        node_check = check_node(spec, model_def, model, optimizer, client)
        doing.stage = "starting"
    if spare:  # ready, but a spare: only a scale-up or a replacement lets it in
        doing.stage = "parked as a spare"
        if not park(client):
            return 0
        doing.stage = "starting"
    # Ready: only now may the master end the running round to let us in.
    if refused := client.register(pid=os.getpid(), probe=probe, node_check=node_check).refused:
        log.error("leaving, as the master says: %s", refused)
        return ExitCode.OK  # not a failure: the master replaces it
    log.info("%s registered with master %s (pid %d)", worker_id, master, os.getpid())
    done = threading.Event()
    beat = threading.Thread(target=_heartbeat_loop, args=(client, state, reg.heartbeat_interval, done),
                            daemon=True, name="heartbeat")
    beat.start()
    doing.stage = "training"
    try:
        if collective is None:  # ParameterServer: independent tasks, no rounds
            finished = trainer.train()
        else:
            finished = _train(spec, client, collective, trainer, state)
            log.info("records of %d steps were read ahead, %d on the spot (read-ahead thread: %s)",
                     trainer.loader.ahead, trainer.loader.now, "on" if trainer.loader.background else "off")
            tasks = trainer.tasks
            log.info("training tasks: %d answered ahead (in %d asks), %d by a plain ask, %d handed over by "
                     "rank 0, %d with the rendezvous answer", tasks.tasks_ahead, tasks.ahead_asks, tasks.tasks_asked,
                     tasks.handed, tasks.given)
            if (traced := trainer.backend.traces()) is not None:  # 2 when prepared ahead: no step waited on one
                log.info("the step's functions were traced %d times", traced)
        loss, samples = state.take_loss()
        traffic = state.traffic.take()
        if samples or state.skipped_steps or traffic:  # since the last heartbeat: the final loss, skipped steps
            client.heartbeat(state.position(), loss, samples, skipped_steps=state.skipped_steps,
                             lr_gain=state.lr_factor, gradient_noise_scale=state.noise_scale,
                             memory=state.sample_memory(), ps_traffic=traffic)
        if finished:
            doing.stage = "evaluating"
            _evaluate(spec, client, model_def, make_predictor(model_def, model, forward), state, state.version,
                      batch=eval_batch)
    finally:
        done.set()
        state.nudge()  # the heartbeat thread ends now
        if collective is not None:
            if trainer.flash is not None:
                trainer.flash.close()
            collective.leave()
        else:
            trainer.close()
    return 0


def _train(spec, client, collective, trainer, state) -> bool:
    """Rounds until training is over; True when it finished, False when told to stop."""
    reason, detail = "start", ""
    while True:
        state.waiting = state.in_rendezvous = True
        try:
            resp = client.join(state.position(), reason, detail, exited_peers=collective.take_exited())
        finally:
            state.waiting = state.in_rendezvous = False
            state.mark_progress()
        if resp.action == pb.JoinRendezvousResponse.STOP:
            return False
        if resp.action == pb.JoinRendezvousResponse.WAIT:
            continue
        synced = state.synced  # in the round it leaves
        state.adopt_round(resp.round_id)  # before anything can report a position (not synced in it yet)
        # Every member plans with the round's M (under auto: the smallest its members probed).
        trainer.max_micro_batch = resp.max_micro_batch or spec.training.effective_max_micro_batch
        trainer.ask_first_task(rank=resp.rank, given=resp.first_task if resp.HasField("first_task") else None)
        try:
            state.waiting = True  # forming the group and the broadcast wait on every member
            try:
                collective.join_round(host=resp.store_host, port=resp.store_port, round_id=resp.round_id,
                                      rank=resp.rank, world_size=resp.world_size)
                trainer.sync_state(restore_from=resp.restore_checkpoint,
                                   in_sync_at=resp.version if resp.members_in_sync else None, synced=synced)
                state.synced = True
            finally:
                state.waiting = False
            log.info("round %d: rank %d of %d at version %d, max micro-batch %d%s", resp.round_id, resp.rank,
                     resp.world_size, state.version, trainer.max_micro_batch,
                     " (members in sync: no state broadcast)" if resp.members_in_sync else "")
            outcome = trainer.run_round()
        except CollectiveError as exc:
            log.warning("%s", exc)
            reason, detail = "collective_failed", str(exc)
            continue
        if outcome == pb.GetTaskResponse.NO_MORE:
            if collective.rank == 0:
                trainer.checkpoint(final=True)
            return True
        if outcome == pb.GetTaskResponse.STOP:
            if collective.rank == 0 and state.version > 0:
                try:  # the job is stopping: leave a checkpoint a resumed job continues from
                    trainer.checkpoint(stop=True)
                except MasterUnreachable as exc:
                    log.error("stop checkpoint not reported: %s", exc)
            return False
        reason, detail = "round_changed", ""


def _run_inference_job(spec, client, reg, model_def, model, worker_id, doing: _Doing) -> int:
    """Evaluation-only or prediction job: load the checkpoint's model, take tasks until none is left."""
    predictor = make_predictor(model_def, model)
    predictor.load_checkpoint(spec.checkpoint)
    processor = load_outputs_processor(model_def) if spec.job_type is JobType.PREDICTION else None
    state = doing.state = WorkerState()
    doing.stage = spec.job_type.value
    client.register(pid=os.getpid())
    done = threading.Event()
    threading.Thread(target=_heartbeat_loop, args=(client, state, reg.heartbeat_interval, done),
                     daemon=True, name="heartbeat").start()
    try:
        if spec.job_type is JobType.EVALUATION:
            _evaluate(spec, client, model_def, predictor, state, predictor.checkpoint_version)
        else:
            _take_tasks(client, state, pb.Task.PREDICTION, lambda task: predict_task(
                model_def, predictor, task, output=spec.output, batch_size=spec.training.effective_max_micro_batch,
                worker_id=worker_id, processor=processor, data_origin=spec.data.prediction))
    finally:
        done.set()
    return 0


def _take_tasks(client, state, kind, run, *, model_version: int = 0, position=None) -> int:
    """Ask for tasks of ``kind`` and run them until the master says NO_MORE or STOP; returns that action.

    ``run(task)`` returns an ``EvalSums`` or the number of samples; a failure is
    reported and the master retries the task (or fails the job past --max-task-retries).
    """
    while True:
        state.mark_progress()
        resp = client.get_task(round_id=-1, task_index=0, position=position or pb.Position(round_id=-1),
                               kind=kind, model_version=model_version)
        if resp.action == pb.GetTaskResponse.RUN:
            try:
                result = run(resp.task)
            except Exception as exc:  # noqa: BLE001 - reported; the master retries or fails the job
                failure = failure_of(exc, stage=_KIND_MODE[kind], step=model_version)
                log_failure(f"task {resp.task.task_id} failed: {one_line(failure)}", exc)
                client.report_task(resp.task.task_id, ok=False, error=one_line(failure), failure=failure)
                continue
            sums, n, states = result if isinstance(result, tuple) else ({}, result, {})
            client.report_task(resp.task.task_id, ok=True, metric_sums=sums, samples=n, metric_states=states)
        elif resp.action == pb.GetTaskResponse.WAIT:
            time.sleep(EVAL_POLL)  # polling the master: tasks may free up when a peer fails
        else:
            return resp.action


def _evaluate(spec, client, model_def, predictor, state, model_version: int, position=None,
              batch: int | None = None) -> int:
    """Take part in the evaluation of the model at ``model_version`` until it is complete, ``batch``
    records at a time (default: the job's max micro-batch)."""
    batch = batch or spec.training.effective_max_micro_batch
    return _take_tasks(client, state, pb.Task.EVALUATION,
                       lambda task: evaluate_task(model_def, predictor, task, batch_size=batch,
                                                          data_origin=spec.data.validation),
                       model_version=model_version, position=position)

