"""The master process: wires ledger, rendezvous, gRPC server, launcher, status.

``run_master`` is what ``flextrain train`` (local backend, in-process) and
``flextrain master`` (in a pod) run. It returns the process exit code: 0 only
when the job succeeded. The job's ledger is built in ``job_ledger.py``; what the
process needs from its host (signals, addresses, exit code, summary) is ``process.py``.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from pathlib import Path

from rich.console import Console

from flextrain.job import Backend, JobSpec, JobType, Strategy
from flextrain.master.adaptive_batches import AdaptiveSchedule
from flextrain.master.checkpoints import CheckpointStore, StateWriteError, write_bytes_atomic
from flextrain.master.coordinator import JobMaster, Phase
from flextrain.master.credentials import job_credentials
from flextrain.master.failures import FailureTracker
from flextrain.master.history import job_history
from flextrain.master.instances import InstanceManager
from flextrain.master.job_ledger import build_ledger, custom_reader_of
from flextrain.master.jobdir import JobDirError
from flextrain.master.k8s_priority import membership as worker_membership
from flextrain.master.launcher import LaunchBackend, LocalProcessBackend
from flextrain.master.metrics import start_metrics
from flextrain.master.process import (_bytes, _install_signal_handlers, _print_summary, _restore_signal_handlers,
                                      _status_json, exit_code, read_ahead_env)
from flextrain.master.ps_fleet import PSFleet, PSStartError, is_ps
from flextrain.master.stores import reachable_host, open_store
from flextrain.master.resume import HISTORY_FILE, record_run, restore
from flextrain.master.servicer import MasterServicer, start_server
from flextrain.master.spares import SparePool
from flextrain.master.status import StatusReporter
from flextrain.master.suspension import Suspension
from flextrain.zygote import Zygote

log = logging.getLogger(__name__)

# Each RPC wakes dozens of gRPC threads across worker and master, and on a busy CPU each
# wake-up preempts a training thread (bench/README.md, "bench/overhead.py"). A heartbeat a second
# keeps the signals it carries back (end of round, stop) within a second.
HEARTBEAT_INTERVAL = 1.0
# The heartbeats the master asks for, all workers together, at most: past HEARTBEATS_PER_SECOND workers
# the period grows with the job (2 s at 1,000 workers), so heartbeats stay a bounded share of the
# master's calls and CPU (bench/master_scale.py). A round's end then reaches a worker through its
# heartbeat a little later; its next task ask (END_ROUND) and a failed collective are unchanged.
HEARTBEATS_PER_SECOND = 500


def heartbeat_interval(max_workers: int) -> float:
    """The heartbeat period of a job of at most ``max_workers`` workers."""
    return max(HEARTBEAT_INTERVAL, max_workers / HEARTBEATS_PER_SECOND)
STATUS_INTERVAL = 1.0  # status.json and the progress bar
EXIT_GRACE = 15.0
STOP_GRACE = 30.0  # how long a stop waits for the workers' stop checkpoint


class ResumeError(RuntimeError):
    pass


def run_master(spec: JobSpec, *, resume: bool = False, console: Console | None = None, **kwargs) -> int:
    """Run a job's master until the job ends, holding the job directory's lock throughout.

    The lock (flextrain/master/jobdir.py) refuses a second master on the same
    directory (JobDirError naming the holder); a Kubernetes master waits a while
    for a predecessor's to go. A run that does not resume first moves whatever
    an earlier job left in the directory aside to ``previous-<time>/``: the
    CLI only gets here for such a directory with ``--overwrite``. Keyword
    arguments are :func:`_run_master`'s.
    """
    from flextrain.master.jobdir import JobDirLock, inspect, move_aside

    console = console or Console(stderr=True)
    wait = 60.0 if spec.backend is Backend.KUBERNETES and kwargs.get("backend") is None else 0.0
    lock = JobDirLock(spec.job_dir).acquire(wait=wait)
    try:
        moved = None
        if not resume and inspect(spec.job_dir).holds_job:
            moved = move_aside(spec.job_dir, keep=(spec.data.training, spec.data.validation, spec.data.prediction,
                                                   spec.checkpoint, spec.output))
        if moved is not None:
            console.print(f"the earlier job's state in {spec.job_dir} was moved to {moved}", markup=False,
                          highlight=False, soft_wrap=True)
        return _run_master(spec, resume=resume, console=console, moved_to=moved, **kwargs)
    finally:
        lock.release()


def _run_master(
    spec: JobSpec,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    backend: LaunchBackend | None = None,
    show_progress: bool = False,
    console: Console | None = None,
    resume: bool = False,
    namespace: str | None = None,
    api_client=None,
    moved_to: Path | None = None,
    changes: tuple[str, ...] = (),
    moved_from: str | None = None,
    zygote: Zygote | None = None,
) -> int:
    """Run a job's master until the job ends (the caller holds the directory's lock).

    With ``spec.backend`` kubernetes (and no ``backend`` given) workers and PS
    run as Pods of the ElasticJob ``spec.name`` in ``namespace`` (default: this
    pod's), dialling the master through its Service, and the job's status is
    also written to the ElasticJob; ``api_client`` overrides the in-cluster /
    kubeconfig client (tests). ``changes`` and ``moved_from`` are what a resume changed and
    where the directory was recorded (flextrain/master/resume.py), for the job's history.
    """
    # Local children fork from a zygote that imports torch while this process does (flextrain/zygote.py);
    # ``zygote``: one the caller started earlier (``flextrain train``: before preflight), closed here
    if zygote is None and backend is None and spec.backend is Backend.LOCAL:
        zygote = Zygote.for_local_job()
    try:
        return _run_job(spec, host=host, port=port, backend=backend, show_progress=show_progress, console=console,
                        resume=resume, namespace=namespace, api_client=api_client, moved_to=moved_to,
                        changes=changes, moved_from=moved_from, zygote=zygote)
    finally:
        if zygote is not None:  # the backend closed it once its children were stopped; after an error, here
            zygote.close()


def _run_job(spec: JobSpec, *, host: str, port: int, backend: LaunchBackend | None, show_progress: bool,
             console: Console | None, resume: bool, namespace: str | None, api_client, moved_to: Path | None,
             changes: tuple[str, ...], moved_from: str | None, zygote: Zygote | None) -> int:
    import torch  # heavy import: only the master process needs it here

    console = console or Console(stderr=True)
    job_dir = Path(spec.job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    store_dir = CheckpointStore(job_dir / "checkpoints")
    skipped: list[str] = []  # data files --skip-unknown-files leaves out: noted once the job exists
    ledger = build_ledger(spec, skipped)
    # Closures over `backend`, which is chosen below: a failure is only ever judged once it is.
    failures = FailureTracker(log_of=lambda w: backend.log_location(w), tail_of=lambda w: backend.output_tail(w))
    job = JobMaster(spec, ledger, checkpoints=store_dir, failures=failures)
    if isinstance(ledger.schedule, AdaptiveSchedule):  # decides from the noise scale the heartbeats carry
        ledger.schedule.noise_scale = lambda: job.adascale[1] if job.adascale else None
    for warning in skipped:  # --skip-unknown-files: the files left out, in the job's events and status
        job.note(warning)
    if moved_to is not None:
        job.note(f"not resuming: the earlier job's state was moved to {moved_to}")
    if spec.job_type is not JobType.TRAINING:  # no training: the model is the given checkpoint's
        job.final_checkpoint = spec.checkpoint
        if spec.output:
            Path(spec.output).mkdir(parents=True, exist_ok=True)
    if changes:  # what this resume changed (flextrain/master/resume.py), in the job's events and history
        job.note(f"resumed with {'; '.join(changes)}")
    if moved_from:
        job.note(f"{job_dir} was recorded at {moved_from}: resuming from its own state here")
    if resume:
        refused = restore(job, store_dir, moved_from=moved_from)
        if refused:
            raise ResumeError(refused)
    if job.accelerating.note:  # --accelerate auto: an earlier run's choice, reused (or unreadable)
        job.note(job.accelerating.note)
    try:  # after the resume's checks: a refused resume leaves the directory as it was
        write_bytes_atomic(job_dir / "jobspec.json", spec.to_json() + "\n")
        record_run(job_dir, "resume" if resume else "start", changes=changes, moved_from=moved_from,
                   previous=str(moved_to) if moved_to else None)
    except OSError as exc:  # StateWriteError names the file; a full disk fails before anything starts
        raise JobDirError(str(exc) if isinstance(exc, StateWriteError) else
                          f"cannot write {job_dir / HISTORY_FILE}: {exc.strerror or exc}") from exc

    k8s = None  # the Kubernetes context, when workers run as pods
    if backend is None and spec.backend is Backend.KUBERNETES:
        from flextrain.master.k8s_context import kubernetes_context
        from flextrain.k8s.pods import memory_ladder
        from flextrain.master.k8s_status import ElasticJobStatusWriter

        def cited() -> set[str]:  # the failed pod the job's failure names (or would): its logs stay readable
            with job.cond:
                root = job.failure if job.over else failures.root_cause()
                return {root.worker_id} if root is not None else set()

        k8s = kubernetes_context(spec, namespace=namespace, api_client=api_client,
                                 on_fatal=lambda message: job.finish(Phase.FAILED, message), on_note=job.note,
                                 keep_failed=cited)
        backend = k8s.backend.start()
        job.micro_batches.oom.ladder = memory_ladder(k8s.backend.job)
        # The job deleted under a running master (no garbage collector got to it): stop as `flextrain stop`
        # does, for nobody can see or stop the job any more.
        status_writer = ElasticJobStatusWriter(k8s.api_client, namespace=k8s.backend.namespace, name=spec.name,
                                               job=k8s.job, on_gone=lambda why: stop(why))
    backend = backend or LocalProcessBackend(log_dir=job_dir / "logs",
                                             worker_memory_limit=_bytes(spec.worker.memory_limit), zygote=zygote)
    stop_requested: list[float] = []

    def stop(reason: str) -> tuple[bool, str]:
        accepted, message = job.request_stop(reason)
        if accepted:
            stop_requested.append(time.monotonic())
        return accepted, message

    manager: InstanceManager | None = None

    def scale(workers: int) -> tuple[bool, str]:
        lo, hi = spec.worker.effective_min_replicas, spec.worker.effective_max_replicas
        if not lo <= workers <= hi:
            return False, job.words(f"cannot scale to {workers} workers: the job allows {lo}..{hi} "
                                    "(--min-workers, --max-workers)")
        if job.over:
            return False, f"job already {job.phase.value}"
        if job.phase is Phase.SUSPENDED or job.suspension:  # no worker now: the count a resume launches
            suspension.desired = workers
            return True, f"suspended: the job resumes with {workers} worker{'s' if workers != 1 else ''}"
        manager.scale(workers)
        return True, f"scaling to {workers} workers"

    spares = SparePool(spec.worker.spares) if spec.worker.spares else None
    suspension = Suspension(job, manager=lambda: manager)
    servicer = MasterServicer(
        job, status_json=lambda: _status_json(reporter), stop=stop, scale=scale,
        heartbeat_interval=heartbeat_interval(spec.worker.effective_max_replicas), spares=spares,
        suspend=suspension.request,
    )
    creds, tls_env = job_credentials(spec, job_dir, kubernetes=k8s is not None)
    server, bound = start_server(servicer, host=host, port=port, threads=16, creds=creds)  # the calls that may block
    address = f"{host}:{bound}"
    # One long-lived TCPStore for the whole job; every round uses its own
    # key prefix over it, which is what makes re-forming gloo groups cheap.
    # It listens on the master's gRPC host (loopback for a local job), not every interface (open_store);
    # made once the server holds its port, so that its own (any free one) cannot be the port asked for.
    # No worker asks for it before one is launched, below.
    store = open_store(host, timedelta(seconds=60))
    job.store_bind, job.store_host, job.store_port = host, reachable_host(host), store.port
    def membership(active: int, desired: int) -> dict:  # pending and preempted workers, and why
        waiting = (k8s.backend.pending() if k8s else set()) - (spares.ids() if spares else set())
        waiting = {i for i in waiting if i.startswith("worker-")}
        return worker_membership(active=active, desired=desired, pending=len(waiting),
                                 preempted=manager.preempted if manager else 0,
                                 last_disruption=manager.last_disruption if manager else "",
                                 unscheduled=k8s.backend.pending_reason(waiting) if k8s else None)

    history = job_history(job, resume=resume)  # events.jsonl (+ TensorBoard), from every status snapshot
    metrics = start_metrics(spec, host=host, kubernetes_job=k8s.job if k8s else None, note=job.note)
    reporter = StatusReporter(
        job, path=job_dir / "status.json", desired=lambda: manager.desired if manager else spec.worker.replicas,
        master_address=address, show_progress=show_progress, console=console,
        sinks=(history, *((status_writer,) if k8s else ()), *((metrics,) if metrics else ())),
        spares=spares.snapshot if spares else None, membership=membership, metrics_url=metrics.url if metrics else "",
    )
    reporter.update()

    cores = os.cpu_count() or 1
    threads = max(1, cores // spec.worker.effective_max_replicas)
    local_env = {} if k8s else read_ahead_env(cores=cores, threads=threads, workers=spec.worker.effective_max_replicas,
                                              gpu=torch.cuda.is_available())
    worker_master = k8s.master_address if k8s else address  # pods dial the master's Service
    manager = InstanceManager(
        backend, desired=spec.worker.replicas, relaunch_budget=spec.worker.relaunch_budget,
        worker_args=lambda wid: ("worker", "--master", worker_master, "--worker-id", wid),
        worker_env=lambda wid: {"FLEXTRAIN_NUM_THREADS": str(threads), "FLEXTRAIN_WORKER_ID": wid,
                                "PYTHONUNBUFFERED": "1", **local_env, **tls_env},
        on_launch=job.worker_launched, on_exit=lambda wid, code: job.worker_exited(wid),
        on_budget_exhausted=job.relaunches_exhausted, on_retire=job.retire,
        judge=lambda wid, code: job.worker_failed(wid, code, reason=backend.exit_reason(wid)),
        spares=spares, worker_memory=lambda: job.micro_batches.oom.memory, on_disrupted=lambda wid, why: job.note(
            f"{wid} was taken away by the cluster ({why}): the job goes on with the workers left; its "
            "replacement waits for capacity and joins when scheduled (no relaunch budget spent)"),
        trained=job.has_trained, on_desired=job.desired_changed,
    )
    fleet: PSFleet | None = None
    if spec.strategy is Strategy.PARAMETER_SERVER:  # the servers to launch (the strategy is in job.strategy)
        fleet = PSFleet(backend, spec, relaunch_budget=spec.worker.relaunch_budget, on_note=job.note,
                        on_failure=lambda message: job.finish(Phase.FAILED, message), resume=resume,
                        start_timeout=300.0 if k8s else 60.0,  # pods may wait for a node or an image pull
                        creds=creds, env=tls_env)
        backend.on_exit(lambda iid, code: fleet.exited(iid, code) if is_ps(iid) else manager.exited(iid, code))
    previous = _install_signal_handlers(lambda: stop("interrupted"))
    try:
        if fleet is not None:  # parameter servers first: workers get their addresses with the JobSpec
            try:
                job.ps_addresses = fleet.start()
                job.note(f"{spec.ps.replicas} parameter server(s) at {', '.join(job.ps_addresses)}")
            except PSStartError as exc:
                job.finish(Phase.FAILED, str(exc))
        if k8s and (k8s.backend.job.get("spec") or {}).get("suspend"):  # relaunched while suspended: stay so
            suspension.request(True, "spec.suspend is true")
        if not job.over:
            manager.reconcile()
        last = 0.0
        while not job.over:
            with job.cond:
                job.cond.wait(STATUS_INTERVAL)
            for worker_id, why in job.tick(unscheduled=k8s.backend.pending() if k8s else set()):
                job.note(f"{worker_id} hangs ({why}): killing it; "
                         "its task is recovered")
                manager.kill(worker_id)
            for slow in job.take_slow_workers():  # stragglers and failed node checks (master/stragglers.py)
                backend.report(reason="SlowWorker", message=slow.message)
                if slow.replace:
                    manager.replace(slow.worker_id, avoid_node=slow.node)
            suspension.tick()
            manager.top_up()  # spares held back while the ones taken join
            if stop_requested and time.monotonic() - stop_requested[0] > STOP_GRACE:
                job.finish(Phase.FAILED, f"stopped: {job.stopping} (no stop checkpoint within {STOP_GRACE:.0f}s)")
            if time.monotonic() - last >= STATUS_INTERVAL:
                reporter.update()
                job.strategy.save(job)  # what --resume continues from, beyond the checkpoints
                last = time.monotonic()
        # Workers learn the outcome from their next RPC or heartbeat and exit; parked spares from their Park.
        if spares is not None:
            spares.close()
        deadline = time.monotonic() + EXIT_GRACE
        def exiting() -> set[str]:  # a pod never scheduled will not exit by itself: close() removes it
            return (backend.running() - (fleet.ids if fleet else set()) - (k8s.backend.pending() if k8s else set())
                    - (spares.ids() if spares else set()))

        while exiting() and time.monotonic() < deadline:
            with job.cond:
                job.cond.wait(0.1)
    finally:
        if fleet is not None:
            fleet.close()
        job.strategy.close(job)
        manager.close(grace=5.0)
        if job.flash is not None:  # the job's shared memory goes with it, its newest snapshot kept on disk
            with job.cond:
                job.flush_flash(why="the job ended")
            job.flash.remove()
        snap = reporter.update()
        reporter.close()
        history.close()
        if k8s:
            status_writer.close()
        server.stop(grace=1.0)
        if metrics is not None:
            metrics.close()
        _restore_signal_handlers(previous)
        del store
    _print_summary(console, snap)
    return exit_code(job)


__all__ = ["run_master", "build_ledger", "custom_reader_of", "exit_code", "heartbeat_interval", "read_ahead_env",
           "ResumeError"]
