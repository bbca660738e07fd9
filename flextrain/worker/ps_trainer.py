"""The ParameterServer trainer: independent workers that pull parameters and push gradients.

Set-up (:meth:`PSTrainer.setup`, idempotent, so it is also the recovery from
a PS that was relaunched with no checkpoint): the PS optimizer is configured
from the module's ``torch.optim`` optimizer (``torch_optimizer_config``);
every ``nn.Embedding`` of the model is replaced by a :class:`PSEmbedding`
whose table (named by the module path, e.g. ``embeddings.0``, with the
embedding's dim and an initializer that matches its initial weights) is
declared on the PS; the remaining parameters are given to ``init_dense``
(the first worker's values win; all workers build the model from the same
seed anyway).

Training: the worker asks the master for TRAINING tasks on its own (no
rendezvous). Minibatch ``j`` of a task is records ``[start + j*G, start +
(j+1)*G)`` with ``G = task.global_batch_size``; per minibatch it pulls the
dense parameters (a no-op answer when unchanged), runs forward/backward in
micro-batches of at most ``--max-micro-batch`` records (each contributing
``loss * size / G``, so the gradient is that of the minibatch's mean loss)
and pushes the dense gradients and the embedding rows' gradients quoting the
versions it pulled. A push a sync PS rejects as stale is recomputed after a
fresh pull. The worker's position says which task it is on (``task_index`` =
task id) and how many of its minibatches were accepted (``steps_done``). A
task is reported done only once every one of its pushes was accepted; a
failure (bad records) reports the minibatches pushed so far as
``steps_done``, so the master requeues only the rest.

Exactly once: every push names its minibatch (task id, records), and each PS
applies a task's records at most once. A worker that dies mid-task may have
pushed minibatches its last heartbeat did not report; the master requeues
the task from the last reported one, and the worker taking it over first
asks the PS how far the task got (``task_progress``): minibatches every PS
has are skipped, and a minibatch only some PS have (the push was cut off
between them) is pushed again and applied only where it is missing. So a
killed worker costs the minibatch it was computing, and applies nothing
twice. When training is over, the first worker told so flushes what SYNC
PS collected but did not apply yet (``grads_to_wait`` > 1).

Periodic evaluation (``--evaluation-steps N``): the model version is the
number of optimizer updates PS 0 applied (every push goes to every PS, and
each applied push moves each PS's version by exactly one, so exactly one
push is answered with each version). The worker whose push PS 0 answers with
a multiple of N, applied, evaluates "the model of step N": right after that
push it pulls the dense parameters once and keeps them for the whole
evaluation, and embedding rows are pulled as evaluation reads them. Other
workers go on pushing meanwhile, so the model evaluated is the PS model at
version >= N (exactly N when no other push landed in between, e.g. with one
worker); it is never older than N. Training resumes once that evaluation is
complete (the master may hand its tasks to other workers that reach a later
version, or to every worker at the end; see master/ps_tasks.py).
"""

from __future__ import annotations

import logging
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb
from flextrain.protocol.codec import dtype_name, torch_optimizer_config
from flextrain.worker.client import MasterClient
from flextrain.worker.backend import all_finite
from flextrain.worker.failure import NonFiniteError, failure_of, log_failure, one_line
from flextrain.worker.module import FeedMetadata, Framework, Mode, ModelDef, ModelDefError
from flextrain.worker.ps_client import PSClient, PSError
from flextrain.worker.pytorch import feed_tensors, take
from flextrain.worker.reading import read_task_records
from flextrain.worker.state import WorkerState

log = logging.getLogger("flextrain.worker.ps")
# Seconds an evaluation waits for the other parameter servers to apply the pushes PS 0 counted.
EVALUATION_CATCH_UP = 5.0

TASK_POLL = 0.2        # seconds between asks while other workers hold the last tasks
MAX_RESETUPS = 5       # PS set-ups redone in a row (a PS lost its state) before giving up
MAX_STALE_RETRIES = 1000  # recomputations of one minibatch after stale pushes


def check_ps_optimizer(model_def: ModelDef, *, lr: float | None) -> None:
    """Submission check for ParameterServer jobs: the module's PyTorch optimizer must be one the PS
    runs. ModelDefError names the module, its ``optimizer`` and why; TensorFlow modules are left
    to their own trainer."""
    if model_def.framework is not Framework.PYTORCH:
        return
    optimizer = model_def.build_optimizer(model_def.build_model(), lr)
    try:
        torch_optimizer_config(optimizer)
    except ValueError as exc:
        raise ModelDefError(f"{model_def.path}: `optimizer` returns {type(optimizer).__name__}, which "
                            f"--distribution-strategy ParameterServer cannot use: {exc}") from None


class PSEmbedding(nn.Module):
    """Stands in for an ``nn.Embedding`` whose rows live on the parameter servers.

    ``forward(ids)`` pulls the distinct ids' rows once, as a leaf tensor; in
    training mode with grad enabled that tensor requires grad and is recorded
    on ``tape`` as ``(table, ids, rows)``, so after backward the trainer pushes
    ``rows.grad`` as the table's sparse gradient.
    """

    def __init__(self, *, client: PSClient, table: str, dim: int, tape: list) -> None:
        super().__init__()
        self.client, self.table, self.dim, self.tape = client, table, dim, tape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # Distinct ids grouped by PS: every PS's rows are one range to pull into and push from.
        distinct, inverse = self.client.distinct(self.table, ids.detach().reshape(-1).cpu().numpy())
        inverse = torch.from_numpy(inverse)
        rows = self.client.pull_embedding(self.table, distinct)
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_(True)
            self.tape.append((self.table, torch.from_numpy(distinct), rows))
        return F.embedding(inverse, rows).reshape(*ids.shape, self.dim)


def _initializer(weight: torch.Tensor) -> tuple[str, dict[str, float]]:
    """The PS initializer closest to how ``weight`` was initialised (zeros, or a normal fit)."""
    if not torch.any(weight):
        return "zeros", {}
    return "normal", {"mean": float(weight.mean()), "std": float(weight.std())}


def replace_embeddings(model: nn.Module, *, client: PSClient, tape: list) -> dict[str, tuple[int, str, dict, str]]:
    """Swap every ``nn.Embedding`` of ``model`` for a :class:`PSEmbedding`; returns table -> (dim, init, args,
    dtype): the table keeps the embedding's dtype (any float dtype), so its rows and gradients do too."""
    tables = {}
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Embedding):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        init, args = _initializer(module.weight.detach())
        tables[name] = (module.embedding_dim, init, args, dtype_name(module.weight.dtype))
        setattr(parent, attr, PSEmbedding(client=client, table=name, dim=module.embedding_dim, tape=tape))
    return tables


class PSTrainer:
    evaluate = None   # evaluate(version): takes part in the evaluation of that version until it is complete
    _due: int = 0     # the version a push just reached that is due for evaluation (0: none)

    def __init__(self, *, spec: JobSpec, model_def: ModelDef, model: nn.Module, optimizer: torch.optim.Optimizer,
                 client: MasterClient, state: WorkerState, ps_addresses: list[str], evaluate=None) -> None:
        """``evaluate(version)``, when given, runs when a push of this worker reaches a version that is a
        multiple of ``spec.training.evaluation_steps`` (see the module docstring)."""
        self.evaluate = evaluate
        if not ps_addresses:
            raise RuntimeError("the master sent no parameter-server addresses (ParameterServer strategy)")
        self.spec, self.model_def, self.model, self.client, self.state = spec, model_def, model, client, state
        self.ps = PSClient(ps_addresses, client_id=client.worker_id, traffic=state.traffic, creds=client.creds)
        self.opt_name, self.opt_hyper = torch_optimizer_config(optimizer)
        self.tape: list = []
        self.tables = replace_embeddings(model, client=self.ps, tape=self.tape)
        self.dense = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.pulled = False

    # ---- parameter servers ----------------------------------------------------
    def setup(self) -> None:
        """Configure the optimizer, declare the tables, give the dense parameters (all idempotent)."""
        self.ps.configure(self.opt_name, self.opt_hyper)
        for table, (dim, init, args, dtype) in self.tables.items():
            self.ps.declare_table(table, dim, initializer=init, init_args=args, seed=self.spec.training.seed, dtype=dtype)
        if self.dense:
            self.ps.init_dense({n: p.detach() for n, p in self.dense.items()})
        self.pulled = False

    def pull(self) -> None:
        """Bring the dense parameters up to date in place (only shards that changed travel)."""
        if not self.dense:
            return
        with torch.no_grad():  # written in place into the parameters: the result is not needed
            self.ps.pull_dense(0 if self.pulled else None, out={n: p.data for n, p in self.dense.items()})
        self.pulled = True

    def _with_ps(self, fn):
        """Run ``fn``; when a PS lost its state (relaunched without a checkpoint), set it up again."""
        for attempt in range(MAX_RESETUPS + 1):
            try:
                return fn()
            except PSError as exc:
                if attempt == MAX_RESETUPS:
                    raise
                log.warning("parameter server refused (%s): setting it up again", exc)
                time.sleep(0.2 * (attempt + 1))
                self.setup()

    # ---- training -------------------------------------------------------------
    def train(self) -> bool:
        """Run training tasks until none is left; True when training finished, False when told to stop."""
        self._with_ps(self.setup)
        with self.state.lock:
            self.state.round_id = 0  # PS mode has no rounds; >= 0 marks a training position
        while True:
            if self.state.stop.is_set():
                return False
            self.state.mark_progress()
            resp = self.client.get_task(round_id=0, task_index=0, position=self.state.position(),
                                        kind=pb.Task.TRAINING)
            if resp.action == pb.GetTaskResponse.RUN:
                self.run_task(resp.task)
            elif resp.action == pb.GetTaskResponse.WAIT:
                time.sleep(TASK_POLL)
            elif resp.action == pb.GetTaskResponse.NO_MORE:
                # Every push of the job was accepted: apply what a SYNC PS still holds back.
                self._with_ps(self.ps.flush)
                self._with_ps(self.pull)  # evaluation uses the final dense parameters
                return True
            else:
                return False

    def run_task(self, task: pb.Task) -> None:
        G = task.global_batch_size
        with self.state.lock:  # steps_done first: a racing heartbeat may under-report, never over-report
            self.state.steps_done = 0
            self.state.task_index = task.task_id  # PS mode: the task's id (see master/ps_tasks.py)
        # Records every PS accepted already (a previous owner died after pushing them).
        accepted = min(self._with_ps(lambda: self.ps.task_progress(task.task_id)))
        if accepted > task.start:
            log.info("task %d: records [%d, %d) are on every PS already (pushed by a previous owner): skipped",
                     task.task_id, task.start, min(accepted, task.end))
        for j, start in enumerate(range(task.start, task.end, G)):
            if self.state.stop.is_set():
                return  # the job is over; the master no longer counts this task
            end = min(start + G, task.end)
            if end <= accepted:
                with self.state.lock:
                    self.state.steps_done = j + 1
                continue
            began = time.monotonic()
            try:
                records = read_task_records(self.model_def, task.source, start, end, mode=Mode.TRAINING,
                                            data_origin=self.spec.data.training)
                features, labels = self._feed(records, FeedMetadata(task.source, start, end, task.epoch))
            except Exception as exc:  # bad data or a failing feed: the rest of the task is retried
                failure = failure_of(exc, stage="training", step=self.state.version)
                log_failure(f"task {task.task_id} (records [{start}, {end}) of {task.source}) failed: "
                            f"{one_line(failure)}", exc)
                self.client.report_task(task.task_id, ok=False, steps_done=j, error=one_line(failure),
                                        failure=failure)
                return
            loss_sum, version = self._with_ps(
                lambda: self._step(features, labels, end - start, step=(task.task_id, start, end)))
            self.state.add_compute(time.monotonic() - began, end - start)  # with its pull and push: no lockstep here
            with self.state.lock:
                self.state.version, self.state.steps_done = version, j + 1
            if math.isfinite(loss_sum):  # NaN: a minibatch skipped as non-finite
                self.state.add_loss(loss_sum, end - start)
            self.state.mark_progress()
            self.evaluate_if_due()
        self.client.report_task(task.task_id, ok=True)

    def _feed(self, records: list[bytes], meta: FeedMetadata):
        """The module's training ``feed`` over one minibatch's records (Keras trainers override it)."""
        return feed_tensors(self.model_def, records, Mode.TRAINING, meta)

    def evaluate_if_due(self) -> None:
        """After a push that reached an evaluation step: evaluate the model pulled now (version >= it)."""
        version, self._due = self._due, 0
        if not version or self.evaluate is None:
            return
        self._with_ps(self.pull)
        # PS 0 counted `version` pushes, but another worker's push counted there may still be on its way
        # to a PS holding other parameters (pushes reach the PS in parallel): pull again until every PS
        # whose dense parameters this worker holds has applied as many, so the model is never older.
        deadline = time.monotonic() + EVALUATION_CATCH_UP
        while any(0 <= v < version for v in self.ps.versions) and time.monotonic() < deadline:
            time.sleep(0.01)
            self._with_ps(self.pull)
        log.info("evaluating the model of step %d (parameter servers at version %d)", version, self.ps.version)
        self.evaluate(version)
        self.state.mark_progress()

    def _step(self, features, labels, n: int, *, step: tuple[int, int, int]) -> tuple[float, int]:
        """Pull, compute and push one minibatch until every PS accepted it; (loss sum, PS version).

        After a partial rejection the minibatch is pushed again to every PS: those that
        accepted it already answer duplicate (``step`` names the records), so nothing is applied twice.
        """
        for _ in range(MAX_STALE_RETRIES):
            self.pull()
            loss_sum, sparse = self._compute(features, labels, n)
            if not (math.isfinite(loss_sum) and all_finite(
                    [p.grad for p in self.dense.values() if p.grad is not None]
                    + [g for _, g in sparse.values()])):
                self._non_finite(step, loss=not math.isfinite(loss_sum))
                return math.nan, self.state.version  # skipped: nothing pushed, nothing applied
            result = self.ps.push({name: p.grad for name, p in self.dense.items()}, sparse, step=step)
            if result.accepted:
                every, v0 = self.spec.training.evaluation_steps, result.versions[0]
                if every and result.applied and not result.duplicates[0] and v0 > 0 and v0 % every == 0:
                    self._due = v0
                return loss_sum, result.version
            log.debug("push rejected (%s): recomputing after a fresh pull", "; ".join(result.messages))
        raise RuntimeError(f"a minibatch was rejected as stale {MAX_STALE_RETRIES} times")

    def _non_finite(self, step: tuple[int, int, int], *, loss: bool) -> None:
        """Nothing of a non-finite minibatch is pushed: fail the job, or drop it (--nan-policy skip-step)."""
        what = f"{'loss' if loss else 'gradient'} of the minibatch of records [{step[1]}, {step[2]}) (task {step[0]})"
        if self.spec.training.nan_policy != "skip-step":
            raise NonFiniteError(f"the {what} is not finite; nothing of it was pushed (--nan-policy fail; "
                                 "skip-step drops such minibatches)")
        log.warning("skipped: the %s is not finite; nothing of it is pushed (--nan-policy skip-step)", what)
        self.state.skipped_steps += 1

    def _compute(self, features, labels, n: int) -> tuple[float, dict]:
        for p in self.dense.values():
            p.grad = None
        self.tape.clear()
        self.model.train()
        micro = self.spec.training.effective_max_micro_batch
        loss_sum = 0.0
        for lo in range(0, n, micro):
            sl = slice(lo, min(lo + micro, n))
            size = sl.stop - sl.start
            loss = self.model_def.loss(take(labels, sl), self.model(take(features, sl)))
            (loss * (size / n)).backward()
            loss_sum += float(loss.detach()) * size
        sparse: dict[str, tuple[list, list]] = {}
        for table, ids, rows in self.tape:
            if rows.grad is not None:
                entry = sparse.setdefault(table, ([], []))
                entry[0].append(ids)
                entry[1].append(rows.grad)
        self.tape.clear()
        return loss_sum, {t: (torch.cat(i), torch.cat(g)) for t, (i, g) in sparse.items()}

    def close(self) -> None:
        self.ps.close()
