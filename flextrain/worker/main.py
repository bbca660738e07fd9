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
import threading
import time

import torch

from flextrain.job import JobSpec, JobType, Strategy
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.client import MasterClient, MasterUnreachable
from flextrain.worker.collective import Collective, CollectiveError
from flextrain.worker.evaluation import evaluate_task, make_predictor
from flextrain.worker.module import Framework, load_model_def
from flextrain.worker.prediction import load_outputs_processor, predict_task
from flextrain.worker.ps_trainer import PSTrainer
from flextrain.worker.trainer import AllReduceTrainer, WorkerState, describe

log = logging.getLogger("flextrain.worker")

EVAL_POLL = 0.2  # seconds between asks while the master has no evaluation task yet


def _heartbeat_loop(client: MasterClient, state: WorkerState, interval: float, done: threading.Event) -> None:
    while not done.wait(interval):
        loss, samples = state.take_loss()
        try:
            resp = client.heartbeat(state.position(), loss, samples, waiting_for_peers=state.waiting,
                                    stalled_seconds=time.monotonic() - state.progressed)
        except MasterUnreachable as exc:
            log.error("%s", exc)
            state.stop.set()
            return
        except Exception as exc:  # noqa: BLE001 - a lost heartbeat is retried next period
            log.warning("heartbeat failed: %s", describe(exc))
            continue
        if resp.end_round:
            state.end_round.set()
        if resp.stop:
            state.stop.set()


def run_worker(master: str, worker_id: str) -> int:
    threads = int(os.environ.get("FLEXTRAIN_NUM_THREADS", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    client = MasterClient(master, worker_id)
    reg = client.job_spec()
    spec = JobSpec.from_json(reg.job_spec_json)
    model_def = load_model_def(spec.model_def)
    torch.manual_seed(spec.seed)
    if model_def.framework is Framework.TENSORFLOW:  # same initial Keras weights in every worker
        from flextrain.worker.tf.checks import seed_tf

        seed_tf(spec.seed)
    model = model_def.build_model()
    if spec.job_type is not JobType.TRAINING:
        return _run_inference_job(spec, client, reg, model_def, model, worker_id)
    optimizer = model_def.build_optimizer(model, spec.learning_rate)
    state = WorkerState()
    collective: Collective | None = None
    if spec.strategy is Strategy.PARAMETER_SERVER:
        ps_trainer = PSTrainer
        predictor = make_predictor(model_def, model)  # evaluates the model with the PS trainer's embeddings
        if model_def.framework is Framework.TENSORFLOW:
            from flextrain.worker.tf.ps import KerasPSTrainer as ps_trainer
        trainer = ps_trainer(spec=spec, model_def=model_def, model=model, optimizer=optimizer, client=client,
                            state=state, ps_addresses=list(reg.ps_addresses),
                            evaluate=lambda version: _evaluate(spec, client, model_def, predictor, state, version,
                                                               position=state.position()))
    else:
        collective = Collective(timeout=spec.worker_timeout)
        predictor = make_predictor(model_def, model)
        trainer = AllReduceTrainer(
            spec=spec, model_def=model_def, model=model, optimizer=optimizer, client=client,
            collective=collective, state=state,
            evaluate=lambda version: _evaluate(spec, client, model_def, predictor, state, version,
                                               position=state.position()))
    # Ready: only now may the master end the running round to let us in.
    client.register(pid=os.getpid())
    log.info("%s registered with master %s (pid %d)", worker_id, master, os.getpid())
    done = threading.Event()
    beat = threading.Thread(target=_heartbeat_loop, args=(client, state, reg.heartbeat_interval, done),
                            daemon=True, name="heartbeat")
    beat.start()
    try:
        if collective is None:  # ParameterServer: independent tasks, no rounds
            finished = trainer.train()
        else:
            finished = _train(spec, client, collective, trainer, state)
            log.info("records of %d steps were read ahead, %d on the spot (read-ahead thread: %s)",
                     trainer.loader.ahead, trainer.loader.now, "on" if trainer.loader.background else "off")
            log.info("training tasks: %d answered ahead (in %d asks), %d by a plain ask",
                     trainer.tasks_ahead, trainer.ahead_asks, trainer.tasks_asked)
        loss, samples = state.take_loss()
        if samples:  # the losses since the last heartbeat: the job's final training loss
            client.heartbeat(state.position(), loss, samples)
        if finished:
            _evaluate(spec, client, model_def, make_predictor(model_def, model), state, state.version)
    finally:
        done.set()
        if collective is not None:
            collective.leave()
        else:
            trainer.close()
    return 0


def _train(spec, client, collective, trainer, state) -> bool:
    """Rounds until training is over; True when it finished, False when told to stop."""
    reason, detail = "start", ""
    while True:
        state.waiting = True
        try:
            resp = client.join(state.position(), reason, detail)
        finally:
            state.waiting = False
            state.mark_progress()
        if resp.action == pb.JoinRendezvousResponse.STOP:
            return False
        if resp.action == pb.JoinRendezvousResponse.WAIT:
            continue
        state.end_round.clear()
        with state.lock:  # adopt the round before anything can report a position
            state.round_id, state.task_index, state.steps_done = resp.round_id, 0, 0
        try:
            collective.join_round(host=resp.store_host, port=resp.store_port, round_id=resp.round_id,
                                  rank=resp.rank, world_size=resp.world_size)
            trainer.sync_state(restore_from=resp.restore_checkpoint)
            log.info("round %d: rank %d of %d at version %d", resp.round_id, resp.rank,
                     resp.world_size, state.version)
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


def _run_inference_job(spec, client, reg, model_def, model, worker_id) -> int:
    """Evaluation-only or prediction job: load the checkpoint's model, take tasks until none is left."""
    predictor = make_predictor(model_def, model)
    predictor.load_checkpoint(spec.checkpoint)
    processor = load_outputs_processor(model_def) if spec.job_type is JobType.PREDICTION else None
    state = WorkerState()
    client.register(pid=os.getpid())
    done = threading.Event()
    threading.Thread(target=_heartbeat_loop, args=(client, state, reg.heartbeat_interval, done),
                     daemon=True, name="heartbeat").start()
    try:
        if spec.job_type is JobType.EVALUATION:
            _evaluate(spec, client, model_def, predictor, state, predictor.checkpoint_version)
        else:
            _take_tasks(client, state, pb.Task.PREDICTION, lambda task: predict_task(
                model_def, predictor, task, output=spec.output, batch_size=spec.effective_max_micro_batch,
                worker_id=worker_id, processor=processor))
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
                client.report_task(resp.task.task_id, ok=False, error=describe(exc))
                continue
            sums, n, states = result if isinstance(result, tuple) else ({}, result, {})
            client.report_task(resp.task.task_id, ok=True, metric_sums=sums, samples=n, metric_states=states)
        elif resp.action == pb.GetTaskResponse.WAIT:
            time.sleep(EVAL_POLL)  # polling the master: tasks may free up when a peer fails
        else:
            return resp.action


def _evaluate(spec, client, model_def, predictor, state, model_version: int, position=None) -> int:
    """Take part in the evaluation of the model at ``model_version`` until it is complete."""
    batch = spec.effective_max_micro_batch
    return _take_tasks(client, state, pb.Task.EVALUATION,
                       lambda task: evaluate_task(model_def, predictor, task, batch_size=batch),
                       model_version=model_version, position=position)

